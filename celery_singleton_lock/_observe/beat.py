"""The emitters of a beat group (``celery_singleton_lock.beat``): each sends its signal
and, when the app sends task events, its beat event."""

from __future__ import annotations

import datetime
import logging
from typing import Any

from celery_singleton_lock._observe.objects import (
    BEAT_CAUGHT_UP_EVENT,
    BEAT_DEPOSED_EVENT,
    BEAT_ELECTED_EVENT,
    BEAT_MISSED_EVENT,
    BEAT_SENT_EVENT,
    BEAT_SKIPPED_EVENT,
    beat_deposed,
    beat_elected,
    beat_slot_caught_up,
    beat_slot_sent,
    beat_slot_skipped,
    beat_slots_missed,
    emit,
)

log = logging.getLogger("celery_singleton_lock.task")


def beat_event(app: Any, event: str, **fields: Any) -> None:
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
    emit(beat_elected, scheduler, group=group, replica=replica, fencing_token=fencing_token,
          since=since)  # fmt: skip
    beat_event(scheduler.app, BEAT_ELECTED_EVENT, group=group, replica=replica,
                fencing_token=fencing_token, since=since)  # fmt: skip


def deposed(scheduler: Any, *, group: str, replica: str, fencing_token: int, reason: str) -> None:
    """``replica`` no longer leads ``group``, for ``reason``."""
    emit(beat_deposed, scheduler, group=group, replica=replica, fencing_token=fencing_token,
          reason=reason)  # fmt: skip
    beat_event(scheduler.app, BEAT_DEPOSED_EVENT, group=group, replica=replica,
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
    emit(beat_slot_sent, scheduler, group=group, entry=entry, scheduled=scheduled,
          fencing_token=fencing_token, task_id=task_id, caught_up=caught_up)  # fmt: skip
    beat_event(scheduler.app, BEAT_SENT_EVENT, group=group, entry=entry, scheduled=scheduled,
                fencing_token=fencing_token, task_id=task_id, caught_up=caught_up)  # fmt: skip


def slot_skipped(
    scheduler: Any, *, group: str, entry: str, scheduled: datetime.datetime, taken_by: int
) -> None:
    """The slot ``scheduled`` of ``entry`` was taken already (by ``taken_by``)."""
    emit(beat_slot_skipped, scheduler, group=group, entry=entry, scheduled=scheduled,
          taken_by=taken_by)  # fmt: skip
    beat_event(scheduler.app, BEAT_SKIPPED_EVENT, group=group, entry=entry,
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
    emit(beat_slot_caught_up, scheduler, group=group, entry=entry, scheduled=scheduled,
          late=late, missed=missed)  # fmt: skip
    beat_event(scheduler.app, BEAT_CAUGHT_UP_EVENT, group=group, entry=entry,
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
    emit(beat_slots_missed, scheduler, group=group, entry=entry, first=first, last=last,
          count=count, catch_up=catch_up)  # fmt: skip
    beat_event(scheduler.app, BEAT_MISSED_EVENT, group=group, entry=entry, first=first,
                last=last, count=count, catch_up=catch_up)  # fmt: skip
