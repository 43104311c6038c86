"""Typed usage of the public API, checked by ``mypy --strict`` (never executed by pytest)."""

from __future__ import annotations

from typing import Any

import redis
from celery import Celery
from celery.result import AsyncResult

from celery_singleton_lock import (
    LockedTask,
    LockError,
    LockNotOwned,
    RedisLock,
    SingletonLockError,
    Skip,
    TaskLocked,
    current_lock,
    skip_info,
)
from celery_singleton_lock.compat.once import AlreadyQueued, QueueOnce
from celery_singleton_lock.compat.singleton import DuplicateTaskError, Singleton, clear_locks
from celery_singleton_lock.pytest_plugin import SingletonLocks
from celery_singleton_lock.signals import lock_conflict

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


def replicated(client: redis.Redis) -> bool:
    lock = RedisLock(client, "orders:{sku-43}", timeout=30.0, replicas=1, replicas_timeout=0.2)
    count: int = lock.replicas
    return lock.acquire(blocking=False) and count == 1


def conflict(exc: TaskLocked) -> tuple[str, str | None]:
    return exc.key, exc.task_id


# -- the compat modules, as their migrated users write them ------------------------------


@app.task(base=Singleton, unique_on=["user_id"], raise_on_duplicate=True, lock_expiry=60)
def sync_user(user_id: int, full: bool = False) -> None:
    return None


@app.task(base=QueueOnce, once={"keys": ["user_id"], "graceful": False, "timeout": 60})
def send_digest(user_id: int) -> None:
    return None


def migrated() -> tuple[str | None, float, int]:
    try:
        sync_user.delay(1)
    except DuplicateTaskError as duplicate:
        holder: str | None = duplicate.task_id
    else:
        holder = None
    try:
        send_digest.delay(1)
    except AlreadyQueued as queued:
        countdown: float = queued.countdown
    else:
        countdown = 0.0
    return holder, countdown, clear_locks(app)


def observed(result: AsyncResult[Any]) -> str | None:
    """The observability names type-check as documented."""

    @lock_conflict.connect
    def on_conflict(sender: Any = None, key: str = "", policy: str = "", **_: Any) -> None:
        del sender, key, policy

    skip: Skip | None = skip_info(result, app=app)
    locks = SingletonLocks.for_app(app)
    locks.assert_no_locks(timeout=0.1)
    return skip.holder_task_id if skip is not None else None
