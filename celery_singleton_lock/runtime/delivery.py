"""One delivery at a time: the lock belongs to one delivery of a message, not to its task id.

A second delivery of a message (broker redelivery, the same task id published twice) is a
rival of the first. It takes the first one's hold over only when that delivery's process is
provably gone; otherwise the lease decides.

"Provably gone" is judged by :mod:`.process`: same boot and PID namespace, and no such
process any more.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from celery_singleton_lock.engine import Holder, RedisLock
from celery_singleton_lock.exceptions import LockNotOwned
from celery_singleton_lock.modes.scope import finished
from celery_singleton_lock.runtime.process import process_state

if TYPE_CHECKING:
    from celery_singleton_lock.runtime.context import Run

__all__ = ["free_hold", "known_task", "reclaim_from_dead_delivery", "task_holder"]

log = logging.getLogger("celery_singleton_lock.task")


def task_holder(lock: RedisLock, task_id: str) -> Holder | None:
    """The hold of ``task_id`` on ``lock`` (on any of its slots), or None."""
    return next((holder for holder in lock.holders() if holder.task_id == task_id), None)


def known_task(lock: RedisLock, task_id: str) -> bool:
    """Whether ``task_id`` holds ``lock`` now or finished a run under it recently."""
    return task_holder(lock, task_id) is not None or finished(lock, task_id)


def free_hold(lock: RedisLock, token: str) -> bool:
    """Release the hold of ``lock``'s key under owner ``token`` (owner-checked): whether it
    was still that owner's to free."""
    try:
        lock.owner_of(token).release()
    except LockNotOwned:
        return False
    return True


def reclaim_from_dead_delivery(run: Run, holders: list[Holder]) -> bool:
    """Take the lock over from an earlier delivery of this very message whose process died
    holding it (acks_late + reject_on_worker_lost requeues without any failure signal):
    only when the holder is this task id, on this host, in a process that no longer exists.
    ``holders``: the lock's holders, as just read."""
    lock = run.lock
    holder = next((found for found in holders if found.task_id == run.task_id), None)
    if holder is None or holder.token is None:
        return False
    if process_state(holder.info) != "gone":
        return False
    if not free_hold(lock, holder.token):
        return False
    log.warning(
        "%s[%s]: took over the lock its dead earlier delivery held", run.task.name, run.task_id
    )
    return lock.acquire(blocking=False)
