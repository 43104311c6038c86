"""Operator tools: reading, clearing and reaping lock keys, preflight checks, and the
``celery locks`` command built on them."""
