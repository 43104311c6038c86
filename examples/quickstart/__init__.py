"""The README's quick start: ``shop.py`` is its task module, and
``python -m examples.quickstart`` runs it on a real worker."""
