"""Drop-in replacements for the two packages people migrate from, on this package's engine.

* :mod:`celery_singleton_lock.compat.singleton`: celery-singleton's ``Singleton``,
  ``clear_locks`` and ``DuplicateTaskError``, its task options (``unique_on``,
  ``raise_on_duplicate``, ``lock_expiry``) and its ``singleton_*`` settings;
* :mod:`celery_singleton_lock.compat.once`: celery-once's ``QueueOnce`` and
  ``AlreadyQueued``, its ``once={...}`` options and ``app.conf.ONCE``.

A migration changes one import line. Both base classes are ``LockedTask`` subclasses in
queue scope: the lock is taken at ``apply_async``, owned by that message, released by its
owner when the run ends, freed when a worker dies, and handed over by a task's own retry.
How the two differ from the originals is in ``docs/migration.md``. Importing this package
imports neither module.
"""

from __future__ import annotations

__all__: list[str] = []
