"""Runs that can no longer release their own lock: a pool process that was killed (the worker's
parent sees it lost, or a hard time limit), and a task revoked before or while running.

The lock is freed only if the holder recorded in Redis is that very task id, and only once
the process that ran the body has stopped: a child told to terminate may still be running
it. Until then a thread watches the process; it gives up once the run no longer holds the
lock (it released it itself, or its lease ran out).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from celery_singleton_lock.engine import RedisLock
from celery_singleton_lock.exceptions import LockNotOwned
from celery_singleton_lock.runtime import headers as hdr
from celery_singleton_lock.runtime.context import republish_followup
from celery_singleton_lock.runtime.delivery import HOST, process_gone, task_holder
from celery_singleton_lock.runtime.run import run_locking

if TYPE_CHECKING:
    from celery_singleton_lock.engine.atomic import Handed, Record
    from celery_singleton_lock.options import LockOptions
    from celery_singleton_lock.runtime.locking import TaskLocking

__all__ = ["release_for_lost_run"]

log = logging.getLogger("celery_singleton_lock.task")

#: How often the worker parent looks whether a lost run's process has exited, and how
#: often it asks Redis whether that run still holds its lock meanwhile.
PID_POLL_INTERVAL = 0.05
HOLD_CHECK_INTERVAL = 1.0


@dataclass(frozen=True)
class LostRun:
    """The hold of a run that someone else frees (its worker's parent, a revoke)."""

    task: Any
    task_id: str
    lock: RedisLock
    locking: TaskLocking

    @property
    def options(self) -> LockOptions:
        return self.locking.options

    @property
    def record(self) -> Record | None:
        return None

    def republish(self, handed: Handed) -> None:
        republish_followup(self.task, self.locking, self.lock.name, handed)

    def released(self, state: str | None, *, held: bool, hold: float = 0.0) -> None:
        if held:
            log.warning(
                "released lock %s of lost or revoked task %s[%s]",
                self.lock.name,
                self.task.name,
                self.task_id,
            )

    def release(self) -> bool:
        """Free the hold (owner-checked), unless a mode deals with the key (hands it to a
        pending follow-up); whether it was freed or handed on."""
        for mode in self.locking.plan.hooks:
            if mode.release(self, None):
                return True
        try:
            self.lock.release()
        except LockNotOwned:
            return False
        self.released(None, held=True)
        return True


def release_for_lost_run(task: Any, task_id: str, args: Any, kwargs: Any, request: Any) -> bool:
    """Free the lock of a run that can no longer release it (see the module docstring).
    Returns whether it was released now (else it is released when that process exits, or
    left to its lease)."""
    locking = run_locking(task, request)
    if locking is None:
        return False
    key = hdr.header_key(request) or locking.key(args, kwargs, received=True)
    probe = locking.new_lock(task.app, key, task_id)
    holder = task_holder(probe, task_id)
    if holder is None or holder.token is None:
        return False
    owner = RedisLock(
        probe.client,
        key,
        token=holder.token,
        scripting=locking.settings.scripting,
        limit=locking.options.limit,
    )
    lost = LostRun(task, task_id, owner, locking)
    if holder.info.get("queued") is True:
        return lost.release()  # taken at publish, never ran
    pid = holder.info.get("pid")
    if holder.info.get("host") != HOST or not isinstance(pid, int):
        return False  # not a process of this host: its lease decides
    if not process_gone(pid):
        threading.Thread(
            target=_release_when_gone,
            args=(lost, pid),
            name=f"singleton-lock-release-{task_id}",
            daemon=True,
        ).start()
        return False
    return lost.release()


def _release_when_gone(lost: LostRun, pid: int) -> None:
    """Wait for process ``pid`` to stop, then release; give up once the lock is no longer
    held by that run (it released it itself, or its lease ran out)."""
    next_check = time.monotonic() + HOLD_CHECK_INTERVAL
    try:
        while not process_gone(pid):
            time.sleep(PID_POLL_INTERVAL)
            if time.monotonic() >= next_check:
                if not lost.lock.owned():
                    return
                next_check = time.monotonic() + HOLD_CHECK_INTERVAL
        lost.release()
    except Exception:  # a background thread must never take the worker down
        log.exception(
            "could not release lock %s of lost task %s[%s]",
            lost.lock.name,
            lost.task.name,
            lost.task_id,
        )
