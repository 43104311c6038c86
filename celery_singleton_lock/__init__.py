"""celery_singleton_lock: run a Celery task at most once at a time per (task, arguments).

This module only re-exports. The lock engine (``RedisLock``) and the exceptions import
nothing from Celery; the Celery-side names are imported on first access, so
``from celery_singleton_lock import RedisLock`` works in any Python program.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from celery_singleton_lock._version import __version__
from celery_singleton_lock.engine.lock import Holder, RedisLock
from celery_singleton_lock.exceptions import (
    LockBackendError,
    LockConnectionError,
    LockError,
    LockLost,
    LockNotOwned,
    ResultLost,
    SingletonLockError,
    TaskLocked,
    TaskThrottled,
    WeightAboveLimit,
)

if TYPE_CHECKING:
    from celery_singleton_lock.integration import setup
    from celery_singleton_lock.ops.admin import Skip, clear_locks, skip_info
    from celery_singleton_lock.task import LockedTask, current_lock

__all__ = [
    "Holder",
    "LockBackendError",
    "LockConnectionError",
    "LockError",
    "LockLost",
    "LockNotOwned",
    "LockedTask",
    "RedisLock",
    "ResultLost",
    "SingletonLockError",
    "Skip",
    "TaskLocked",
    "TaskThrottled",
    "WeightAboveLimit",
    "__version__",
    "clear_locks",
    "current_lock",
    "setup",
    "skip_info",
]

# Celery-side names and the module that defines each, imported when first asked for.
_LAZY = {
    "LockedTask": "celery_singleton_lock.task",
    "current_lock": "celery_singleton_lock.task",
    "clear_locks": "celery_singleton_lock.ops.admin",
    "skip_info": "celery_singleton_lock.ops.admin",
    "Skip": "celery_singleton_lock.ops.admin",
    "setup": "celery_singleton_lock.integration",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
