"""Global IDs: gapless per-tenant invoice numbers (``python -m examples.global_id.run``)."""
