"""The public signals of the locks (each ``Signal`` with its reference docstring under it),
the names of the worker events, and :func:`emit`, which sends a signal so that nothing a
receiver does reaches the task. :mod:`celery_singleton_lock.signals` re-exports the
signals as the public names."""

from __future__ import annotations

import logging
from typing import Any

from celery.utils.dispatch import Signal

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


def emit(signal: Signal, task: Any, **named: Any) -> None:
    """Send ``signal`` from ``task``; nothing a receiver does reaches the task."""
    if not signal.receivers:
        return
    try:
        signal.send(sender=task, **named)
    except Exception:  # Celery's send already catches receivers' errors; belt and braces
        log.exception("a receiver of %s failed", getattr(signal, "name", signal))
