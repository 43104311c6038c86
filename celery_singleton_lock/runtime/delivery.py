"""One delivery at a time: the lock belongs to one delivery of a message, not to its task id.

A second delivery of a message (broker redelivery, the same task id published twice) is a
rival of the first. It takes the first one's hold over only when that delivery's process is
provably gone (on this host, no such process); otherwise the lease decides.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import TYPE_CHECKING

from celery_singleton_lock.engine import Holder, RedisLock
from celery_singleton_lock.exceptions import LockNotOwned
from celery_singleton_lock.modes.scope import finished

if TYPE_CHECKING:
    from celery_singleton_lock.runtime.context import Run

__all__ = ["HOST", "known_task", "process_gone", "reclaim_from_dead_delivery", "task_holder"]

log = logging.getLogger("celery_singleton_lock.task")

HOST = socket.gethostname()


def task_holder(lock: RedisLock, task_id: str) -> Holder | None:
    """The hold of ``task_id`` on ``lock`` (on any of its slots), or None."""
    return next((holder for holder in lock.holders() if holder.task_id == task_id), None)


def known_task(lock: RedisLock, task_id: str) -> bool:
    """Whether ``task_id`` holds ``lock`` now or finished a run under it recently."""
    return task_holder(lock, task_id) is not None or finished(lock, task_id)


def process_gone(pid: object) -> bool:
    """Whether ``pid`` names no running process on this host (an exited child that its
    parent has not reaped yet, a zombie, counts as gone)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state in (b"Z", b"X")


def reclaim_from_dead_delivery(run: Run) -> bool:
    """Take the lock over from an earlier delivery of this very message whose process died
    holding it (acks_late + reject_on_worker_lost requeues without any failure signal):
    only when the holder is this task id, on this host, in a process that no longer exists."""
    lock = run.lock
    holder = task_holder(lock, run.task_id)
    if holder is None or holder.token is None:
        return False
    if holder.info.get("host") != HOST or not process_gone(holder.info.get("pid")):
        return False
    dead = RedisLock(
        lock.client, lock.name, token=holder.token, scripting=lock.scripting, limit=lock.limit
    )
    try:
        dead.release()
    except LockNotOwned:
        return False
    log.warning(
        "%s[%s]: took over the lock its dead earlier delivery held", run.task.name, run.task_id
    )
    return lock.acquire(blocking=False)
