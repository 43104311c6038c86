"""The lease-loss watch moved to :mod:`celery_singleton_lock.modes.watch` (it is the
``lock_on_lost="raise"`` mode's); this name stays for code that imported it here."""

from celery_singleton_lock.modes.watch import POLL_INTERVAL, SIGNAL, watching

__all__ = ["POLL_INTERVAL", "SIGNAL", "watching"]
