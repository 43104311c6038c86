"""The package's signals, and its receivers of Celery's own.

Public signals (Celery ``Signal`` objects; the sender is the task, every argument is a
keyword)::

    lock_acquired   key, task_id, fencing_token, waited, policy, scope
    lock_released   key, task_id, fencing_token, held, renewals, state, policy, scope, hold
    lock_conflict   key, task_id, holder_task_id, policy, scope
    lock_lost       key, task_id, fencing_token, held, renewals, policy, scope
    lock_renewed    key, task_id, fencing_token (from the thread that extended the lease)
    lock_throttled  key, task_id, policy, scope, rate, retry_in
    lock_coalesced  key, task_id (the follow-up's), scope       (in the producer)
    lock_superseded key, task_id (superseded), by, running     (producer, and worker)
    lock_debounced  key, task_id (the burst's), generation     (a stale message, worker)
    lock_reaped     key, task_id, why                          (celery locks reap)
    lock_parked     key, task_id, position, scope              (lock_on_conflict="park")
    lock_unparked   key, task_id, scope                        (a parked call starts)

and those of beat replicas (``celery_singleton_lock.beat``; the sender is the
``LeaderScheduler``, in the beat process)::

    beat_elected         group, replica, fencing_token, since
    beat_deposed         group, replica, fencing_token, reason
    beat_slot_sent       group, entry, scheduled, fencing_token, task_id, caught_up
    beat_slot_skipped    group, entry, scheduled, taken_by
    beat_slot_caught_up  group, entry, scheduled, late, missed
    beat_slots_missed    group, entry, first, last, count, catch_up

``waited``, ``held``, ``hold`` and ``retry_in`` are seconds. They are sent in the process
that runs the task (a queue-scope publish that finds its key held sends ``lock_conflict``
in the producer, with ``task_id=None``); a receiver's exception is logged and never
reaches the task. Connect with ``@lock_acquired.connect`` like any Celery signal.

The receivers below release locks at the end of every run, however it ends. They are
connected by :func:`connect` (once per process, ``dispatch_uid``), which
:func:`.integration.setup` calls when an app is set up; importing this module connects
nothing.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import signals
from celery.exceptions import TimeLimitExceeded, WorkerLostError

from celery_singleton_lock._observe import (
    beat_deposed,
    beat_elected,
    beat_slot_caught_up,
    beat_slot_sent,
    beat_slot_skipped,
    beat_slots_missed,
    lock_acquired,
    lock_coalesced,
    lock_conflict,
    lock_debounced,
    lock_lost,
    lock_parked,
    lock_reaped,
    lock_released,
    lock_renewed,
    lock_superseded,
    lock_throttled,
    lock_unparked,
)
from celery_singleton_lock.runtime import (
    received_request,
    release_after_run,
    release_for_dropped_message,
    release_for_lost_run,
    remember_delivery,
)

__all__ = [
    "beat_deposed",
    "beat_elected",
    "beat_slot_caught_up",
    "beat_slot_sent",
    "beat_slot_skipped",
    "beat_slots_missed",
    "connect",
    "lock_acquired",
    "lock_coalesced",
    "lock_conflict",
    "lock_debounced",
    "lock_lost",
    "lock_parked",
    "lock_reaped",
    "lock_released",
    "lock_renewed",
    "lock_superseded",
    "lock_throttled",
    "lock_unparked",
]

log = logging.getLogger("celery_singleton_lock.signals")


def _on_postrun(
    sender: Any = None, task_id: str | None = None, state: str | None = None, **_: Any
) -> None:
    """Every run ends here (Celery sends it from a ``finally``): release its lock."""
    if sender is not None and task_id:
        release_after_run(sender, task_id, state)


def _on_revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
    """A revoked task never runs (or was terminated): free the lock it holds, if any."""
    if sender is None or request is None or not getattr(request, "id", None):
        return
    try:
        release_for_lost_run(sender, request.id, request.args or (), request.kwargs or {}, request)
    except Exception:  # a receiver must never break the worker
        log.exception("could not release the lock of revoked task %s", request.id)


def _on_failure(
    sender: Any = None,
    task_id: str | None = None,
    exception: BaseException | None = None,
    args: Any = None,
    kwargs: Any = None,
    **_: Any,
) -> None:
    """The pool's parent saw a child die or hit the hard time limit: the child cannot
    release, so the parent does, at once, instead of waiting out the lease."""
    if (
        sender is None
        or not task_id
        or not isinstance(exception, (WorkerLostError, TimeLimitExceeded))
    ):
        return
    # The message's own headers (its key and per-call options), kept when it was received;
    # the task's request in this process is not that message's.
    request = received_request(task_id) or sender.request
    try:
        release_for_lost_run(sender, task_id, args or (), kwargs or {}, request)
    except Exception:
        log.exception("could not release the lock of lost task %s", task_id)


def _on_received(sender: Any = None, request: Any = None, **_: Any) -> None:
    """The worker's main process received a message: remember its lock headers."""
    if request is not None:
        try:
            remember_delivery(request)
        except Exception:  # a receiver must never break the worker
            log.exception("could not note the lock headers of %s", getattr(request, "id", None))


def _on_dropped(sender: Any = None, message: Any = None, **_: Any) -> None:
    """The worker drops a message without running it (an unknown task, a body it cannot
    decode): free the queue lock its publish took."""
    app = getattr(sender, "app", None)
    if app is None or message is None:
        return
    try:
        release_for_dropped_message(app, message)
    except Exception:  # a receiver must never break the worker
        log.exception("could not release the lock of a dropped message")


def connect() -> None:
    """Connect every receiver (idempotent)."""
    signals.task_postrun.connect(_on_postrun, weak=False, dispatch_uid="csl.postrun")
    signals.task_revoked.connect(_on_revoked, weak=False, dispatch_uid="csl.revoked")
    signals.task_failure.connect(_on_failure, weak=False, dispatch_uid="csl.failure")
    signals.task_received.connect(_on_received, weak=False, dispatch_uid="csl.received")
    signals.task_unknown.connect(_on_dropped, weak=False, dispatch_uid="csl.unknown")
    signals.task_rejected.connect(_on_dropped, weak=False, dispatch_uid="csl.rejected")
