"""Runs that can no longer release their own lock: a pool process that was killed (the worker's
parent sees it lost, or a hard time limit), a task revoked before or while running, and a
message the worker drops without running it (an unregistered task in a rolling deploy, a
body it cannot decode).

The lock is freed only if the holder recorded in Redis is that very task id, and only once
the process that ran the body has stopped: a child told to terminate may still be running
it. Until then a thread watches the process; it gives up once the run no longer holds the
lock (it released it itself, or its lease ran out).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from celery_singleton_lock.client import redis_for
from celery_singleton_lock.config import settings_for
from celery_singleton_lock.engine import RedisLock
from celery_singleton_lock.exceptions import LockNotOwned
from celery_singleton_lock.runtime import headers as hdr
from celery_singleton_lock.runtime.context import publish_past_lock
from celery_singleton_lock.runtime.delivery import free_hold, task_holder
from celery_singleton_lock.runtime.finish import GivenUp
from celery_singleton_lock.runtime.process import process_state
from celery_singleton_lock.runtime.run import run_locking

if TYPE_CHECKING:
    from celery_singleton_lock.modes.base import HandedCall
    from celery_singleton_lock.runtime.locking import TaskLocking

__all__ = [
    "received_request",
    "release_for_dropped_message",
    "release_for_lost_run",
    "remember_delivery",
]

log = logging.getLogger("celery_singleton_lock.task")

#: How many received messages' lock headers the worker's main process keeps (a lost run's
#: parent-side release needs its per-call key and options; the oldest go first).
RECEIVED_KEPT = 10_000
_received: OrderedDict[str, dict[str, Any]] = OrderedDict()
_received_guard = threading.Lock()
#: How often the worker parent looks whether a lost run's process has exited, and how
#: often it asks Redis whether that run still holds its lock meanwhile.
PID_POLL_INTERVAL = 0.05
HOLD_CHECK_INTERVAL = 1.0


@dataclass(frozen=True)
class LostRun(GivenUp):
    """The hold of a run that someone else frees (its worker's parent, a revoke)."""

    locking: TaskLocking

    blocking = False  # the worker's main process: the consumer must go on
    given_up = (
        logging.WARNING,
        "released lock %(key)s of lost or revoked task %(task)s[%(task_id)s]",
    )

    def publish_past_lock(self, call: HandedCall) -> None:
        publish_past_lock(self.task, self.locking, self.lock.name, call)

    def release(self) -> bool:
        """Free the hold (owner-checked), unless a mode deals with the key (hands it to a
        pending follow-up); whether it was freed or handed on."""
        for mode in self.locking.plan.release:
            if mode.release(self, None):
                return True
        try:
            self.lock.release()
        except LockNotOwned:
            return False
        self.released(None, held=True)
        return True


def remember_delivery(request: Any) -> None:
    """The worker's main process received a message (``task_received``): keep the lock
    headers it carries (its key, its per-call options), which a parent-side release of its
    run needs should the pool process running it be lost."""
    carried = getattr(request, "request_dict", None)
    if isinstance(carried, dict):  # a worker's Request: its message's headers, as sent
        kept = {
            name: value
            for name in (hdr.HEADER_KEY, hdr.HEADER_OPTIONS)
            if (value := carried.get(name)) is not None
        }
    else:
        kept = {
            name: value
            for name in (hdr.HEADER_KEY, hdr.HEADER_OPTIONS)
            if (value := hdr.header(request, name)) is not None
        }
    task_id = getattr(request, "id", None)
    if not task_id or not kept:
        return
    with _received_guard:
        _received[str(task_id)] = kept
        _received.move_to_end(str(task_id))
        while len(_received) > RECEIVED_KEPT:
            _received.popitem(last=False)


def received_request(task_id: str) -> Any:
    """A request-like object with the lock headers of the message ``task_id`` this process
    received (None when it kept none)."""
    with _received_guard:
        kept = _received.get(task_id)
    return None if kept is None else SimpleNamespace(id=task_id, headers=dict(kept))


def release_for_dropped_message(app: Any, message: Any) -> bool:
    """A worker dropped a message without running it (``task_unknown``: no such task here,
    say during a rolling deploy; ``task_rejected``: a body it cannot decode): free the
    queue lock its publish took, owner-checked, so calls with those arguments are not
    swallowed for ``lock_queue_timeout``. Only a hold taken at publish for that very task
    id is freed."""
    headers = getattr(message, "headers", None) or {}
    key, task_id = headers.get(hdr.HEADER_KEY), headers.get("id")
    if not key or not task_id:
        return False
    settings = settings_for(app)
    client = redis_for(app, settings.url)
    probe = RedisLock(client, str(key), scripting=settings.scripting)
    holder = task_holder(probe, str(task_id))
    if holder is None or holder.token is None or holder.info.get("queued") is not True:
        return False
    if not free_hold(probe, holder.token):
        return False
    log.warning(
        "released lock %s of %s[%s]: the worker dropped its message without running it",
        key,
        headers.get("task"),
        task_id,
    )
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
        for mode in locking.plan.forget:  # not running: its modes let go of it
            mode.forget(probe.client, key, task_id)
        return False
    owner = probe.owner_of(holder.token)
    lost = LostRun(task, task_id, owner, locking.options, locking)
    if holder.info.get("queued") is True:
        return lost.release()  # taken at publish, never ran
    state = process_state(holder.info)
    if state is None:
        return False  # not a process this one can judge: its lease decides
    if state == "running":
        threading.Thread(
            target=_release_when_gone,
            args=(lost, holder.info),
            name=f"singleton-lock-release-{task_id}",
            daemon=True,
        ).start()
        return False
    return lost.release()


def _release_when_gone(lost: LostRun, info: dict[str, object]) -> None:
    """Wait for the process ``info`` names to stop, then release; give up once the lock is
    no longer held by that run (it released it itself, or its lease ran out)."""
    next_check = time.monotonic() + HOLD_CHECK_INTERVAL
    try:
        while process_state(info) == "running":
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
