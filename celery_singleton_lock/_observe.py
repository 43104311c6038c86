"""What the worker tells the world about its locks: the public signals, the worker event of a
skipped duplicate, and the record that makes a skip queryable afterwards.

The :class:`~celery.utils.dispatch.Signal` objects live here, below :mod:`.runtime` (which
sends them); :mod:`celery_singleton_lock.signals` re-exports them as the public names.
Sending costs nothing but a list check when nobody listens; with receivers connected, the
only extra Redis read is the holder of a lock a ``wait`` run starts waiting for. Celery's
``Signal.send`` already logs and swallows a receiver's exception; the helpers here also
guard against anything else going wrong, so observing a lock never breaks a task.
"""

from __future__ import annotations

import ast
import datetime
import inspect
import json
import logging
import re
import sys
import time
from typing import TYPE_CHECKING, Any

from celery.utils.dispatch import Signal

from celery_singleton_lock.engine.lock import RedisLock
from celery_singleton_lock.engine.wire import call
from celery_singleton_lock.exceptions import LockBackendError

if TYPE_CHECKING:
    from celery_singleton_lock.options import LockOptions

__all__ = [
    "BEAT_EVENTS",
    "SKIPPED_EVENT",
    "THROTTLED_EVENT",
    "RunLock",
    "acquired",
    "beat_deposed",
    "beat_elected",
    "beat_slot_caught_up",
    "beat_slot_sent",
    "beat_slot_skipped",
    "beat_slots_missed",
    "conflict",
    "events_markdown",
    "lock_acquired",
    "lock_coalesced",
    "lock_conflict",
    "lock_debounced",
    "lock_lost",
    "lock_parked",
    "lock_released",
    "lock_renewed",
    "lock_superseded",
    "lock_throttled",
    "lock_unparked",
    "lost",
    "parked",
    "released",
    "signals_markdown",
    "skip_record_key",
    "skipped",
    "throttled",
    "unparked",
]

log = logging.getLogger("celery_singleton_lock.task")

lock_acquired = Signal(name="lock_acquired")
"""A run took its lock. Sender: the task. Keyword arguments: ``key``, ``task_id``,
``fencing_token``, ``waited`` (seconds from the first try to holding it), ``policy``,
``scope``."""

lock_released = Signal(name="lock_released")
"""A run released its lock at its end. Sender: the task. Keyword arguments: ``key``,
``task_id``, ``fencing_token``, ``held`` (seconds), ``renewals`` (lease extensions while
held), ``state`` (the run's Celery state; ``"STARTED"`` under ``lock_release="start"``),
``policy``, ``scope``, ``hold`` (seconds the key stays held after a successful run under
``lock_release="success"``, else 0.0)."""

lock_conflict = Signal(name="lock_conflict")
"""A run (or a queue-scope publish) found its key held and applies ``policy``: ``"skip"``,
``"wait"`` (sent as the wait starts), ``"retry"`` or ``"raise"``; a publish also
``"coalesce"``, ``"replace"`` or ``"debounce"`` (a later call of an open burst). Sender: the
task. Keyword arguments: ``key``, ``task_id`` (None for a publish: nothing was published),
``holder_task_id`` (None when unknown), ``policy``, ``scope``, ``limit`` (the stacked limit,
``lock_limits``, that had no room for the run while its key was free; else None)."""

lock_renewed = Signal(name="lock_renewed")
"""A run's lease was extended (by the renewer thread, or by the task's own ``extend()``).
Sent from the thread that extended it. Sender: the task. Keyword arguments: ``key``,
``task_id``, ``fencing_token``."""

lock_lost = Signal(name="lock_lost")
"""A run's lease was lost while its body ran (renewal found the hold gone, or its deadline
passed unconfirmed): another run may have taken the key meanwhile. Sent from the run's
process as the run ends. Sender: the task. Keyword arguments: ``key``, ``task_id``,
``fencing_token``, ``held`` (seconds), ``renewals``, ``policy``, ``scope``."""

lock_throttled = Signal(name="lock_throttled")
"""A run held its key but the key's start rate (``lock_rate_limit``) was used up: the run
did not start and applies ``policy``: ``"skip"``, ``"retry"`` or ``"raise"`` (the key given
back), or ``"wait"`` (sent as the wait starts; the key is kept meanwhile). Sender: the task.
Keyword arguments:
``key``, ``task_id``, ``policy``, ``scope``, ``rate`` (the rate string, e.g. ``"10/m"``),
``retry_in`` (seconds until the next start would be admitted)."""

lock_coalesced = Signal(name="lock_coalesced")
"""A queue-scope call under ``lock_on_conflict="coalesce"`` (or ``"replace"`` while the holder
runs) found its key held and became the pending follow-up, or replaced its arguments:
nothing was published. Sent in the producer. Sender: the task. Keyword arguments: ``key``,
``task_id`` (the follow-up's, which every such call gets), ``scope``."""

lock_superseded = Signal(name="lock_superseded")
"""A queued call was superseded (``lock_on_conflict="replace"``). Sent in the producer when
the new call takes the key (``by`` is its task id), and again in the worker when the
superseded message is delivered and ends without running. Sender: the task. Keyword
arguments: ``key``, ``task_id`` (the superseded one), ``by``, ``running`` (True when a running
holder was revoked: ``lock_replace_running``)."""

lock_reaped = Signal(name="lock_reaped")
"""``celery locks reap`` freed a hold whose holder was proven gone. Sent in the process that
reaped. Sender: the task when the app knows it by name, else the app. Keyword arguments:
``key``, ``task_id``, ``why``."""

lock_debounced = Signal(name="lock_debounced")
"""A debounced call's message was delivered after a later call of its burst: it ends
without running (the burst runs once, with the last call). Sent in the worker. Sender: the
task. Keyword arguments: ``key``, ``task_id`` (the burst's), ``generation``."""

lock_parked = Signal(name="lock_parked")
"""A run (or, in queue scope, a call) found its key held and was parked
(``lock_on_conflict="park"``): its message waits in the key's park queue (a run held back
by its stacked limits or its rate: among the held calls, until they have room or its window
opens), its result state is ``PARKED``. Sent where it parked (the worker, or the producer
in queue scope). Sender: the task. Keyword arguments: ``key``, ``task_id``, ``position``
(1 is next; 0 for a run held back by its ``lock_limits`` or parked until its
``lock_rate_limit`` window frees), ``scope``."""

lock_unparked = Signal(name="lock_unparked")
"""A parked call that was handed its key starts its run. Sent in the worker. Sender: the
task. Keyword arguments: ``key``, ``task_id``, ``scope``."""

beat_elected = Signal(name="beat_elected")
"""A beat replica became the leader of its group (``celery_singleton_lock.beat``): from now
on it sends the group's schedule. Sent in that beat process. Sender: the
``LeaderScheduler``. Keyword arguments: ``group``, ``replica``, ``fencing_token`` (of its
lease), ``since`` (aware UTC datetime, the lock Redis's clock)."""

beat_deposed = Signal(name="beat_deposed")
"""A beat leader stopped leading: its lease was taken or is gone, its renewal could not be
confirmed before the lease ran out, or it stopped (``reason`` says which). It sends
nothing more and stands by. Sender: the ``LeaderScheduler``. Keyword arguments: ``group``,
``replica``, ``fencing_token``, ``reason``."""

beat_slot_sent = Signal(name="beat_slot_sent")
"""The beat leader took a slot of a schedule entry and published its task. Sender: the
``LeaderScheduler``. Keyword arguments: ``group``, ``entry``, ``scheduled`` (aware UTC
datetime of the slot), ``fencing_token``, ``task_id`` (of the message published; None
when the scheduler returned no result), ``caught_up`` (True for a slot that came due while
nobody led, sent by the catch-up rule ``"once"``)."""

beat_slot_skipped = Signal(name="beat_slot_skipped")
"""The beat leader did not send a slot because the entry's record in the lock Redis says
it was taken already (by an earlier leader). Sender: the ``LeaderScheduler``. Keyword
arguments: ``group``, ``entry``, ``scheduled``, ``taken_by`` (the fencing token of the
leader that took it, or the later slot it took)."""

beat_slot_caught_up = Signal(name="beat_slot_caught_up")
"""A new leader sent, by the catch-up rule ``"once"``, the most recent slot of an entry
that came due while nobody led (sent with ``beat_slot_sent`` too). Sender: the
``LeaderScheduler``. Keyword arguments: ``group``, ``entry``, ``scheduled``, ``late``
(seconds between the slot and its send), ``missed`` (slots that came due meanwhile, this
one included)."""

beat_slots_missed = Signal(name="beat_slots_missed")
"""Slots of an entry that came due while nobody led (or before the entry appeared or its
schedule changed) and are not sent: all of them under ``"skip"``, all but the most recent
under ``"once"``. Sender: the ``LeaderScheduler``. Keyword arguments: ``group``,
``entry``, ``first`` and ``last`` (aware UTC datetimes of the first and last of them),
``count``, ``catch_up`` (the rule applied)."""

#: The worker event a skipped duplicate sends (``task.send_event``), for Flower and
#: other event consumers. Fields: ``uuid``, ``name``, ``key``, ``holder_task_id``.
SKIPPED_EVENT = "task-lock-skipped"
#: The worker event a throttled run sends, whatever its policy. Fields: ``uuid``, ``name``,
#: ``key``, ``policy``, ``rate``, ``retry_in``.
THROTTLED_EVENT = "task-lock-throttled"
#: Events of the other outcomes (fields as the signal's keyword arguments, plus ``uuid`` and
#: ``name``). ``task-lock-coalesced`` and a producer's ``task-lock-superseded`` are sent from
#: the producer, only when the app sets ``task_send_sent_event`` (as Celery's ``task-sent``).
COALESCED_EVENT = "task-lock-coalesced"
SUPERSEDED_EVENT = "task-lock-superseded"
DEBOUNCED_EVENT = "task-lock-debounced"
REAPED_EVENT = "task-lock-reaped"
PARKED_EVENT = "task-lock-parked"
UNPARKED_EVENT = "task-lock-unparked"
#: Events of a beat group (fields as the signals' keyword arguments, datetimes as ISO
#: texts), sent from the beat process when the app sets ``worker_send_task_events``.
BEAT_ELECTED_EVENT = "beat-elected"
BEAT_DEPOSED_EVENT = "beat-deposed"
BEAT_SENT_EVENT = "beat-slot-sent"
BEAT_SKIPPED_EVENT = "beat-slot-skipped"
BEAT_CAUGHT_UP_EVENT = "beat-slot-caught-up"
BEAT_MISSED_EVENT = "beat-slots-missed"
BEAT_EVENTS = (
    BEAT_ELECTED_EVENT,
    BEAT_DEPOSED_EVENT,
    BEAT_SENT_EVENT,
    BEAT_SKIPPED_EVENT,
    BEAT_CAUGHT_UP_EVENT,
    BEAT_MISSED_EVENT,
)
#: How long the record of a skip is kept when the app sets no ``result_expires``.
_DEFAULT_RECORD_TTL = 86400.0


class RunLock(RedisLock):
    """The ``RedisLock`` of one task run, with what the signals report: when the hold began,
    its fencing token, and how many times its lease was extended (by the renewer or by the
    task's own ``extend()`` calls)."""

    task: Any = None
    task_id: str | None = None
    acquired_at: float | None = None
    held_token: int | None = None
    renewals: int = 0
    lost_reported: bool = False

    def _renewed(self) -> None:
        """The lease was extended (by the renewer or by ``extend()``): count it, send
        ``lock_renewed``."""
        self.renewals += 1
        if self.task is not None:
            _send(
                lock_renewed,
                self.task,
                key=self.name,
                task_id=self.task_id,
                fencing_token=self.held_token,
            )


def _send(signal: Signal, task: Any, **named: Any) -> None:
    """Send ``signal`` from ``task``; nothing a receiver does reaches the task."""
    if not signal.receivers:
        return
    try:
        signal.send(sender=task, **named)
    except Exception:  # Celery's send already catches receivers' errors; belt and braces
        log.exception("a receiver of %s failed", getattr(signal, "name", signal))


def acquired(
    task: Any, lock: RedisLock, task_id: str, options: LockOptions, started: float
) -> None:
    """The run of ``task_id`` holds ``lock`` since now; it began trying at ``started``."""
    now = time.monotonic()
    if isinstance(lock, RunLock):
        lock.acquired_at = now
        lock.held_token = lock.fencing_token
        lock.renewals = 0
        lock.task, lock.task_id = task, task_id
    _send(
        lock_acquired,
        task,
        key=lock.name,
        task_id=task_id,
        fencing_token=lock.fencing_token,
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
    _send(
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
    _send(
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
    _send(
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


def skip_record_key(prefix: str, task_id: str) -> str:
    """Where the record of the skipped run ``task_id`` is kept: beside the lock keys, but
    outside ``prefix:*``, so ``locks list`` and ``clear_locks`` never see it."""
    return f"{prefix}~skipped:{task_id}"


def _record_ttl(app: Any) -> float:
    """Seconds a skip record lives: as long as the app keeps task results."""
    expires = app.conf.get("result_expires")
    if isinstance(expires, datetime.timedelta):
        expires = expires.total_seconds()
    if isinstance(expires, (int, float)) and not isinstance(expires, bool) and expires > 0:
        return float(expires)
    return _DEFAULT_RECORD_TTL


def skipped(
    task: Any,
    client: Any,
    *,
    prefix: str,
    key: str,
    task_id: str,
    holder_task_id: str | None,
    reason: str = "held",
    explanation: dict[str, Any] | None = None,
) -> None:
    """A duplicate run of ``task`` was skipped: keep a record of it (read back with
    ``skip_info(result)``) and, from a worker, send the ``task-lock-skipped`` event. A
    run skipped because its key was throttled (``reason="throttled"``) is recorded the
    same way; its event is ``task-lock-throttled``, sent by :func:`throttled`.
    ``explanation`` (why the key blocked, as ``Explanation.as_json()`` gives it) is kept
    in the record too."""
    record = {
        "key": key,
        "holder_task_id": holder_task_id,
        "task": task.name,
        "at": time.time(),
        "reason": reason,
        "explanation": explanation,
    }
    try:
        call(
            key,
            client.set,
            skip_record_key(prefix, task_id),
            json.dumps(record, sort_keys=True),
            px=max(1, int(_record_ttl(task.app) * 1000)),
        )
    except LockBackendError as exc:
        log.warning("%s[%s]: could not record the skip: %s", task.name, task_id, exc)
    if reason == "held":
        _event(task, task_id, SKIPPED_EVENT, key=key, holder_task_id=holder_task_id)


#: Whether this worker sends task events (``celery worker -E``, ``worker_send_task_events``):
#: set by the worker's bootstep before the pool starts; the lock's worker events follow it,
#: as Celery's own task events do.
_worker_events = False


def worker_events(enabled: bool) -> None:
    """Say whether this worker (and the pool processes it starts) sends task events."""
    global _worker_events  # noqa: PLW0603 - one worker per process
    _worker_events = enabled


def _event(task: Any, task_id: str, event: str, **fields: Any) -> None:
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
    _send(
        lock_throttled,
        task,
        key=key,
        task_id=task_id,
        policy=policy,
        scope=scope,
        rate=rate,
        retry_in=retry_in,
    )
    _event(task, task_id, THROTTLED_EVENT, key=key, policy=policy, rate=rate, retry_in=retry_in)


def _producer_event(task: Any, task_id: str, event: str, **fields: Any) -> None:
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
    _send(lock_coalesced, task, key=key, task_id=task_id, scope=scope)
    _producer_event(task, task_id, COALESCED_EVENT, key=key)


def superseded(task: Any, key: str, task_id: str, *, by: str, running: bool) -> None:
    """``task_id``'s call was superseded by ``by``: in the producer as it happens, in the
    worker when the superseded message is delivered (and ends without running)."""
    _send(lock_superseded, task, key=key, task_id=task_id, by=by, running=running)
    if getattr(task.request, "hostname", None) and not task.request.is_eager:
        _event(task, task_id, SUPERSEDED_EVENT, key=key, by=by, running=running)
    else:
        _producer_event(task, task_id, SUPERSEDED_EVENT, key=key, by=by, running=running)


def debounced(task: Any, key: str, task_id: str, *, generation: int) -> None:
    """A stale message of the burst ``task_id`` was delivered and ends without running."""
    _send(lock_debounced, task, key=key, task_id=task_id, generation=generation)
    _event(task, task_id, DEBOUNCED_EVENT, key=key, generation=generation)


def parked(task: Any, key: str, task_id: str, *, position: int, scope: str) -> None:
    """The call ``task_id`` was parked on ``key`` at ``position``."""
    _send(lock_parked, task, key=key, task_id=task_id, position=position, scope=scope)
    if getattr(task.request, "hostname", None) and not task.request.is_eager:
        _event(task, task_id, PARKED_EVENT, key=key, position=position)
    else:
        _producer_event(task, task_id, PARKED_EVENT, key=key, position=position)


def unparked(task: Any, key: str, task_id: str, *, scope: str) -> None:
    """The parked call ``task_id``, handed ``key``, starts its run."""
    _send(lock_unparked, task, key=key, task_id=task_id, scope=scope)
    _event(task, task_id, UNPARKED_EVENT, key=key)


def reaped(app: Any, key: str, task_id: str | None, *, why: str) -> None:
    """``celery locks reap`` freed ``key`` (the hold of ``task_id``): signal and event."""
    task = None
    if task_id is not None:
        holder_task = key.split(":")
        task = next((t for name, t in app.tasks.items() if name in holder_task), None)
    sender = task if task is not None else app
    _send(lock_reaped, sender, key=key, task_id=task_id, why=why)
    try:
        with app.events.default_dispatcher() as dispatcher:
            dispatcher.send(REAPED_EVENT, uuid=task_id, key=key, why=why)
    except Exception as exc:  # noqa: BLE001 - an event never fails the command
        log.debug("could not send %s for %s: %s", REAPED_EVENT, key, exc)


# ------------------------------------------------------------------------------ beat


def _beat_event(app: Any, event: str, **fields: Any) -> None:
    """Send the beat event ``event`` when ``app`` sends task events
    (``worker_send_task_events``); a broker that cannot take it never stops beat."""
    if not app.conf.worker_send_task_events:
        return
    shown = {k: v.isoformat() if isinstance(v, datetime.datetime) else v for k, v in fields.items()}
    try:
        with app.events.default_dispatcher() as dispatcher:
            dispatcher.send(event, **shown)
    except Exception as exc:  # noqa: BLE001 - an event never stops beat
        log.debug("could not send %s: %s", event, exc)


def elected(
    scheduler: Any, *, group: str, replica: str, fencing_token: int, since: datetime.datetime
) -> None:
    """``replica`` leads beat group ``group`` since ``since``."""
    _send(beat_elected, scheduler, group=group, replica=replica, fencing_token=fencing_token,
          since=since)  # fmt: skip
    _beat_event(scheduler.app, BEAT_ELECTED_EVENT, group=group, replica=replica,
                fencing_token=fencing_token, since=since)  # fmt: skip


def deposed(scheduler: Any, *, group: str, replica: str, fencing_token: int, reason: str) -> None:
    """``replica`` no longer leads ``group``, for ``reason``."""
    _send(beat_deposed, scheduler, group=group, replica=replica, fencing_token=fencing_token,
          reason=reason)  # fmt: skip
    _beat_event(scheduler.app, BEAT_DEPOSED_EVENT, group=group, replica=replica,
                fencing_token=fencing_token, reason=reason)  # fmt: skip


def slot_sent(
    scheduler: Any,
    *,
    group: str,
    entry: str,
    scheduled: datetime.datetime,
    fencing_token: int,
    task_id: str | None,
    caught_up: bool,
) -> None:
    """The leader published the slot ``scheduled`` of ``entry``."""
    _send(beat_slot_sent, scheduler, group=group, entry=entry, scheduled=scheduled,
          fencing_token=fencing_token, task_id=task_id, caught_up=caught_up)  # fmt: skip
    _beat_event(scheduler.app, BEAT_SENT_EVENT, group=group, entry=entry, scheduled=scheduled,
                fencing_token=fencing_token, task_id=task_id, caught_up=caught_up)  # fmt: skip


def slot_skipped(
    scheduler: Any, *, group: str, entry: str, scheduled: datetime.datetime, taken_by: int
) -> None:
    """The slot ``scheduled`` of ``entry`` was taken already (by ``taken_by``)."""
    _send(beat_slot_skipped, scheduler, group=group, entry=entry, scheduled=scheduled,
          taken_by=taken_by)  # fmt: skip
    _beat_event(scheduler.app, BEAT_SKIPPED_EVENT, group=group, entry=entry,
                scheduled=scheduled, taken_by=taken_by)  # fmt: skip


def slot_caught_up(
    scheduler: Any,
    *,
    group: str,
    entry: str,
    scheduled: datetime.datetime,
    late: float,
    missed: int,
) -> None:
    """A new leader sent the most recent missed slot ``scheduled`` of ``entry``."""
    _send(beat_slot_caught_up, scheduler, group=group, entry=entry, scheduled=scheduled,
          late=late, missed=missed)  # fmt: skip
    _beat_event(scheduler.app, BEAT_CAUGHT_UP_EVENT, group=group, entry=entry,
                scheduled=scheduled, late=late, missed=missed)  # fmt: skip


def slots_missed(
    scheduler: Any,
    *,
    group: str,
    entry: str,
    first: datetime.datetime,
    last: datetime.datetime,
    count: int,
    catch_up: str,
) -> None:
    """``count`` slots of ``entry`` from ``first`` to ``last`` are not sent."""
    _send(beat_slots_missed, scheduler, group=group, entry=entry, first=first, last=last,
          count=count, catch_up=catch_up)  # fmt: skip
    _beat_event(scheduler.app, BEAT_MISSED_EVENT, group=group, entry=entry, first=first,
                last=last, count=count, catch_up=catch_up)  # fmt: skip


# ------------------------------------------------------------------ documentation


def _signal_docs() -> list[tuple[str, str, set[str]]]:
    """``(name, docstring, keywords sent)`` of every public signal of this module, in the
    order they are defined: the docstring written under each ``Signal(...)``, and the
    keyword arguments of every ``_send(<signal>, ...)`` call here (read from the source, so
    the reference can never list a keyword that is not sent, or miss one that is)."""
    tree = ast.parse(inspect.getsource(sys.modules[__name__]))
    found: list[tuple[str, str]] = []
    body = tree.body
    for node, following in zip(body, [*body[1:], None], strict=True):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
            and node.value.func.id == "Signal"
            and isinstance(node.targets[0], ast.Name)
        ):
            doc = ""
            if isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant):
                doc = str(following.value.value)
            found.append((node.targets[0].id, doc))
    sent: dict[str, set[str]] = {name: set() for name, _ in found}
    for sending in ast.walk(tree):
        if (
            isinstance(sending, ast.Call)
            and isinstance(sending.func, ast.Name)
            and sending.func.id == "_send"
            and sending.args
            and isinstance(sending.args[0], ast.Name)
            and sending.args[0].id in sent
        ):
            sent[sending.args[0].id].update(k.arg for k in sending.keywords if k.arg is not None)
    return [(name, doc, sent[name]) for name, doc in found]


def _markdown(text: str) -> str:
    """A docstring as one line of Markdown: ````x```` becomes ```x```, ``|`` is escaped."""
    return " ".join(text.split()).replace("``", "`").replace("|", "\\|")


def documented_keywords(doc: str) -> set[str]:
    """The keyword argument names a signal's docstring lists after "Keyword arguments:"
    (names in double backticks, outside parentheses)."""
    doc = " ".join(doc.split())
    listed = doc.split("Keyword arguments:", 1)[-1] if "Keyword arguments:" in doc else ""
    depth, outside = 0, []
    for ch in listed:
        depth += ch == "("
        if depth == 0:
            outside.append(ch)
        depth -= ch == ")" and depth > 0
    return set(re.findall(r"``([a-z_]+)``", "".join(outside)))


def signals_markdown() -> str:
    """The reference table of the signals for the docs, generated from this module: each
    ``Signal``'s docstring split into when it is sent, its sender and its keyword
    arguments. ``ValueError`` when a docstring and the keywords actually sent disagree."""
    lines = [
        "| signal | sent when | sender | keyword arguments |",
        "|---|---|---|---|",
    ]
    for name, doc, sent in _signal_docs():
        documented = documented_keywords(doc)
        if documented != sent:
            raise ValueError(
                f"{name}: its docstring lists {sorted(documented)}, it is sent with {sorted(sent)}"
            )
        when, _, rest = " ".join(doc.split()).partition("Sender:")
        sender, _, keywords = rest.partition("Keyword arguments:")
        lines.append(
            f"| `{name}` | {_markdown(when)} | {_markdown(sender).rstrip('.')} "
            f"| {_markdown(keywords).rstrip('.')} |"
        )
    return "\n".join(lines) + "\n"


#: Who sends an event, by the helper that sends it.
_EVENT_SENDERS = {
    "_event": (
        "the worker the message was delivered to, when it sends task events (`-E`)",
        ("uuid", "name", "hostname"),
    ),
    "_producer_event": (
        "the producer, when the app sets `task_send_sent_event`",
        ("uuid", "name"),
    ),
    "send": ("the process that ran `celery locks reap`", ()),
    "_beat_event": (
        "the beat leader (`celery_singleton_lock.beat`), when the app sets "
        "`worker_send_task_events`",
        (),
    ),
}


def events_markdown() -> str:
    """The reference table of the worker events for the docs, generated from this
    module's source: every ``_event``, ``_producer_event`` and dispatcher ``send`` of an
    ``*_EVENT`` constant, with the fields it passes."""
    module = sys.modules[__name__]
    tree = ast.parse(inspect.getsource(module))
    found: dict[str, dict[str, set[str]]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        helper = (
            node.func.id
            if isinstance(node.func, ast.Name)
            else node.func.attr
            if isinstance(node.func, ast.Attribute)
            else ""
        )
        if helper not in _EVENT_SENDERS:
            continue
        names = [arg.id for arg in node.args if isinstance(arg, ast.Name)]
        constant = next((name for name in names if name.endswith("_EVENT")), None)
        if constant is None:
            continue
        event = str(getattr(module, constant))
        fields = found.setdefault(event, {}).setdefault(helper, set())
        fields.update(_EVENT_SENDERS[helper][1])
        fields.update(k.arg for k in node.keywords if k.arg is not None)
    lines = ["| event | sent by | fields |", "|---|---|---|"]
    for event in sorted(found):
        for helper, fields in sorted(found[event].items()):
            shown = ", ".join(f"`{field}`" for field in sorted(fields))
            lines.append(f"| `{event}` | {_EVENT_SENDERS[helper][0]} | {shown} |")
    return "\n".join(lines) + "\n"
