"""celery_singleton_lock: run a Celery task at most once at a time per (task, arguments).

This module only re-exports; see ``lock`` for the Redis lock engine and ``task`` for the
Celery side.
"""

from celery_singleton_lock import signals as _signals  # noqa: F401  (connects the receivers)
from celery_singleton_lock._version import __version__
from celery_singleton_lock.exceptions import (
    LockBackendError,
    LockError,
    LockNotOwned,
    SingletonLockError,
    TaskLocked,
)
from celery_singleton_lock.lock import RedisLock
from celery_singleton_lock.task import LockedTask, current_lock

__all__ = [
    "LockBackendError",
    "LockError",
    "LockNotOwned",
    "LockedTask",
    "RedisLock",
    "SingletonLockError",
    "TaskLocked",
    "__version__",
    "current_lock",
]
