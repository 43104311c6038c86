"""Typed usage of the public API, checked by ``mypy --strict`` (never executed by pytest)."""

from __future__ import annotations

import redis
from celery import Celery

from celery_singleton_lock import (
    LockedTask,
    LockError,
    LockNotOwned,
    RedisLock,
    SingletonLockError,
    TaskLocked,
    current_lock,
)

app = Celery("typed", broker="redis://127.0.0.1:6379/0")


@app.task(base=LockedTask, lock_keys=["sku"], lock_on_conflict="wait", lock_timeout=10)
def buy(sku: str, user_id: int) -> bool:
    lock = current_lock()
    token: int | None = lock.fencing_token if lock is not None else None
    return token is not None


def engine(client: redis.Redis) -> int | None:
    lock = RedisLock(client, "orders:{sku-42}", timeout=30.0, auto_renew=True)
    acquired: bool = lock.acquire(blocking=True, timeout=5.0)
    if not acquired:
        return None
    try:
        held: bool = lock.owned() and lock.locked()
        lock.extend(60.0)
        return lock.fencing_token if held else None
    except LockNotOwned as exc:
        failure: LockError = exc
        raise SingletonLockError(str(failure)) from exc
    finally:
        lock.release()


def conflict(exc: TaskLocked) -> tuple[str, str | None]:
    return exc.key, exc.task_id
