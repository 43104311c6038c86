"""The emitters the runtime and the modes call as a run or a call meets its lock: each
sends its signal (and, where there is one, its worker or producer event), and guards
against anything going wrong, so observing a lock never breaks a task. Sending costs
nothing but a list check when nobody listens; with receivers connected, the only extra
Redis read is the holder of a lock a ``wait`` run starts waiting for."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from celery_singleton_lock._observe.objects import (
    COALESCED_EVENT,
    DEBOUNCED_EVENT,
    PARKED_EVENT,
    REAPED_EVENT,
    SUPERSEDED_EVENT,
    THROTTLED_EVENT,
    UNPARKED_EVENT,
    emit,
    lock_acquired,
    lock_coalesced,
    lock_conflict,
    lock_debounced,
    lock_lost,
    lock_parked,
    lock_reaped,
    lock_released,
    lock_superseded,
    lock_throttled,
    lock_unparked,
)
from celery_singleton_lock._observe.runlock import RunLock
from celery_singleton_lock.exceptions import LockBackendError

if TYPE_CHECKING:
    from celery_singleton_lock.engine.lock import RedisLock
    from celery_singleton_lock.options import LockOptions

log = logging.getLogger("celery_singleton_lock.task")


def acquired(
    task: Any, lock: RedisLock, task_id: str, options: LockOptions, started: float
) -> None:
    """The run of ``task_id`` holds ``lock`` since now; it began trying at ``started``."""
    now = time.monotonic()
    fencing_token = lock.fencing_token
    if isinstance(lock, RunLock):
        lock.acquired_at = now
        lock.held_token = fencing_token
        lock.renewals = 0
        lock.task, lock.task_id = task, task_id
    if not lock_acquired.receivers:
        return
    emit(
        lock_acquired,
        task,
        key=lock.name,
        task_id=task_id,
        fencing_token=fencing_token,
        waited=max(0.0, now - started),
        policy=options.on_conflict,
        scope=options.scope,
    )


def conflict(
    task: Any,
    key: str,
    task_id: str | None,
    *,
    policy: str,
    scope: str,
    holder_task_id: str | None = None,
    lock: RedisLock | None = None,
    limit: str | None = None,
) -> None:
    """A run or publish found ``key`` held (or a stacked ``limit`` full) and applies
    ``policy``. When the holder is not known yet and someone listens, ``lock`` is asked who
    holds it (one read)."""
    if not lock_conflict.receivers:
        return
    if holder_task_id is None and lock is not None:
        try:
            holder = lock.holder()
        except LockBackendError:
            holder = None
        holder_task_id = holder.task_id if holder is not None else None
    emit(
        lock_conflict,
        task,
        key=key,
        task_id=task_id,
        holder_task_id=holder_task_id,
        policy=policy,
        scope=scope,
        limit=limit,
    )


def _held(lock: RedisLock) -> tuple[float | None, int | None, int]:
    """Seconds held so far, the hold's fencing token and its renewals."""
    if not isinstance(lock, RunLock) or lock.acquired_at is None:
        return None, lock.fencing_token, 0
    return time.monotonic() - lock.acquired_at, lock.held_token, lock.renewals


def lost(task: Any, lock: RedisLock, task_id: str, options: LockOptions) -> None:
    """The run's lease was lost: log it and send ``lock_lost`` (once per hold)."""
    if isinstance(lock, RunLock):
        if lock.lost_reported:
            return
        lock.lost_reported = True
    held, token, renewals = _held(lock)
    log.warning(
        "%s[%s]: the lease of lock %s was lost while the task ran (fencing token %s); "
        "another run may have held it meanwhile",
        getattr(task, "name", task),
        task_id,
        lock.name,
        token,
    )
    emit(
        lock_lost,
        task,
        key=lock.name,
        task_id=task_id,
        fencing_token=token,
        held=held,
        renewals=renewals,
        policy=options.on_conflict,
        scope=options.scope,
    )


def released(
    task: Any,
    lock: RedisLock,
    task_id: str,
    options: LockOptions,
    state: str | None,
    *,
    hold: float = 0.0,
) -> None:
    """The run released ``lock`` as it ended in ``state`` (or keeps the key ``hold`` seconds
    more, after a success under ``lock_release="success"``)."""
    if not lock_released.receivers:
        return
    held, token, renewals = _held(lock)
    emit(
        lock_released,
        task,
        key=lock.name,
        task_id=task_id,
        fencing_token=token,
        held=held,
        renewals=renewals,
        state=state,
        policy=options.on_conflict,
        scope=options.scope,
        hold=hold,
    )


#: Whether this worker sends task events (``celery worker -E``, ``worker_send_task_events``):
#: set by the worker's bootstep before the pool starts; the lock's worker events follow it,
#: as Celery's own task events do.
_worker_events = False


def worker_events(enabled: bool) -> None:
    """Say whether this worker (and the pool processes it starts) sends task events."""
    global _worker_events  # noqa: PLW0603 - one worker per process
    _worker_events = enabled


def worker_event(task: Any, task_id: str, event: str, **fields: Any) -> None:
    """Send the worker event ``event`` about the run ``task_id`` when this worker sends task
    events (nothing outside a worker; a broker without events never fails the task)."""
    request = task.request
    if not _worker_events or request.is_eager or not getattr(request, "hostname", None):
        return  # no worker, or one that sends no task events: no event
    try:
        task.send_event(event, retry=False, name=task.name, **fields)
    except Exception as exc:  # noqa: BLE001 - a broker without events (SQS) must not fail the task
        log.debug("could not send %s for %s[%s]: %s", event, task.name, task_id, exc)


def throttled(
    task: Any,
    key: str,
    task_id: str,
    *,
    policy: str,
    scope: str,
    rate: str,
    retry_in: float,
) -> None:
    """The run ``task_id`` did not start: ``key`` used up its start rate. Log it, send
    ``lock_throttled`` and, from a worker, the ``task-lock-throttled`` event."""
    log.info(
        "%s[%s] throttled: %s used up %s; next free start in %.3f s (%s)",
        task.name,
        task_id,
        key,
        rate,
        retry_in,
        policy,
    )
    emit(
        lock_throttled,
        task,
        key=key,
        task_id=task_id,
        policy=policy,
        scope=scope,
        rate=rate,
        retry_in=retry_in,
    )
    worker_event(
        task, task_id, THROTTLED_EVENT, key=key, policy=policy, rate=rate, retry_in=retry_in
    )


def producer_event(task: Any, task_id: str, event: str, **fields: Any) -> None:
    """Send ``event`` from a producer, when the app sends ``task-sent`` events too."""
    app = task.app
    if not app.conf.task_send_sent_event:
        return
    try:
        with app.events.default_dispatcher() as dispatcher:
            dispatcher.send(event, uuid=task_id, name=task.name, **fields)
    except Exception as exc:  # noqa: BLE001 - an event never fails a call
        log.debug("could not send %s for %s[%s]: %s", event, task.name, task_id, exc)


def coalesced(task: Any, key: str, task_id: str, *, scope: str) -> None:
    """A call became (or updated) the pending follow-up ``task_id`` of ``key``."""
    emit(lock_coalesced, task, key=key, task_id=task_id, scope=scope)
    producer_event(task, task_id, COALESCED_EVENT, key=key)


def superseded(task: Any, key: str, task_id: str, *, by: str, running: bool) -> None:
    """``task_id``'s call was superseded by ``by``: in the producer as it happens, in the
    worker when the superseded message is delivered (and ends without running)."""
    emit(lock_superseded, task, key=key, task_id=task_id, by=by, running=running)
    if getattr(task.request, "hostname", None) and not task.request.is_eager:
        worker_event(task, task_id, SUPERSEDED_EVENT, key=key, by=by, running=running)
    else:
        producer_event(task, task_id, SUPERSEDED_EVENT, key=key, by=by, running=running)


def debounced(task: Any, key: str, task_id: str, *, generation: int) -> None:
    """A stale message of the burst ``task_id`` was delivered and ends without running."""
    emit(lock_debounced, task, key=key, task_id=task_id, generation=generation)
    worker_event(task, task_id, DEBOUNCED_EVENT, key=key, generation=generation)


def parked(task: Any, key: str, task_id: str, *, position: int, scope: str) -> None:
    """The call ``task_id`` was parked on ``key`` at ``position``."""
    emit(lock_parked, task, key=key, task_id=task_id, position=position, scope=scope)
    if getattr(task.request, "hostname", None) and not task.request.is_eager:
        worker_event(task, task_id, PARKED_EVENT, key=key, position=position)
    else:
        producer_event(task, task_id, PARKED_EVENT, key=key, position=position)


def unparked(task: Any, key: str, task_id: str, *, scope: str) -> None:
    """The parked call ``task_id``, handed ``key``, starts its run."""
    emit(lock_unparked, task, key=key, task_id=task_id, scope=scope)
    worker_event(task, task_id, UNPARKED_EVENT, key=key)


def reaped(app: Any, key: str, task_id: str | None, *, why: str) -> None:
    """``celery locks reap`` freed ``key`` (the hold of ``task_id``): signal and event."""
    task = None
    if task_id is not None:
        holder_task = key.split(":")
        task = next((t for name, t in app.tasks.items() if name in holder_task), None)
    sender = task if task is not None else app
    emit(lock_reaped, sender, key=key, task_id=task_id, why=why)
    try:
        with app.events.default_dispatcher() as dispatcher:
            dispatcher.send(REAPED_EVENT, uuid=task_id, key=key, why=why)
    except Exception as exc:  # noqa: BLE001 - an event never fails the command
        log.debug("could not send %s for %s: %s", REAPED_EVENT, key, exc)
