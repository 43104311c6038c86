"""Slot arithmetic: which scheduled times of a schedule entry are due, derived from the
schedule itself, never from a replica's local state (pure functions, no Redis).

A *slot* is one scheduled time of an entry, in Unix milliseconds. The slot after ``t`` is
what the schedule says comes next after ``t``, computed "as of ``t``" (the schedule's
``now`` is pinned to ``t``), so every replica derives the same slot from the same ``t``
whatever its clock: an interval schedule's slots are ``t + k * run_every`` from the last
slot taken; a crontab's and a solar schedule's are their fire times, whatever ``t``.

:func:`plan` says what a leader does at server time ``now`` with the slots from ``start``
on: those that came due before ``since`` (nobody led, or the entry is new or changed) were
missed, and only the most recent of them is offered to the catch-up rule; those that came
due since are all due, in order.
"""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from celery.schedules import BaseSchedule, schedule

__all__ = [
    "MAX_DUE",
    "NotComputable",
    "Plan",
    "from_ms",
    "interval_ms",
    "latest_before",
    "next_slot",
    "plan",
    "to_ms",
]

#: The most slots one plan sends at once; older ones are counted as missed (a leader that
#: renews its lease every tick never has more than a lease's worth of them).
MAX_DUE = 1000
#: How many slots a search walks at most (a crontab firing every minute over a week).
_MAX_WALK = 20_000
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


class NotComputable(Exception):
    """The schedule cannot say when its next slot is from a given time (it has no
    ``remaining_estimate``, or ignores ``nowfun``): the leader then asks ``is_due``."""


def to_ms(moment: dt.datetime) -> int:
    """A datetime as Unix milliseconds (naive: taken as UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)
    return (moment - _EPOCH) // dt.timedelta(milliseconds=1)


def from_ms(ms: int) -> dt.datetime:
    """Unix milliseconds as an aware UTC datetime."""
    return _EPOCH + dt.timedelta(milliseconds=ms)


def interval_ms(sched: Any) -> int | None:
    """The period of a plain interval schedule (``schedule(run_every=...)``, not
    ``relative``) in ms, None for any other schedule (or a period below 1 ms)."""
    if not isinstance(sched, schedule) or getattr(sched, "relative", False):
        return None
    run_every = getattr(sched, "run_every", None)
    if not isinstance(run_every, dt.timedelta):
        return None
    period = run_every // dt.timedelta(milliseconds=1)
    return period if period >= 1 else None


def _local(sched: Any, moment: dt.datetime) -> dt.datetime:
    """``moment`` in the schedule's own timezone (the app's), as beat hands times to a
    schedule: older Celery versions match a crontab's fields in the timezone of the
    datetime they are given."""
    try:
        zone = sched.tz
    except Exception:  # noqa: BLE001 - a schedule without an app or a timezone: keep UTC
        return moment
    return moment.astimezone(zone) if isinstance(zone, dt.tzinfo) else moment


def next_slot(sched: Any, after_ms: int) -> int | None:
    """The first slot of ``sched`` strictly after ``after_ms``, None when there is none (a
    one-off time already past). ``NotComputable`` when the schedule cannot tell."""
    period = interval_ms(sched)
    if period is not None:
        return after_ms + period
    estimate = getattr(sched, "remaining_estimate", None)
    if not isinstance(sched, BaseSchedule) or estimate is None:
        raise NotComputable(f"{sched!r} is not a celery schedule")
    at = _local(sched, from_ms(after_ms))
    pinned: Any = copy.copy(sched)
    pinned.nowfun = lambda: at
    try:
        if to_ms(pinned.now()) != after_ms:
            raise NotComputable(f"{sched!r} does not read its time from nowfun")
        delta = pinned.remaining_estimate(at)
    except NotImplementedError as exc:
        raise NotComputable(f"{sched!r} has no remaining_estimate") from exc
    if not isinstance(delta, dt.timedelta):
        raise NotComputable(f"{sched!r}.remaining_estimate gave {delta!r}")
    found = after_ms + delta // dt.timedelta(milliseconds=1)
    return found if found > after_ms else None


def latest_before(sched: Any, start: int, bound: int) -> int:
    """The latest slot before ``bound`` from ``start`` on (``start`` is a slot before
    ``bound``): arithmetic for an interval, else a search back from ``bound`` whose steps
    double (a crontab's slots do not depend on where one starts looking)."""
    period = interval_ms(sched)
    if period is not None:
        return start + (bound - 1 - start) // period * period
    following = next_slot(sched, start)
    if following is None or following >= bound:
        return start
    reach = max(1000, following - start)
    while True:
        look_from = bound - reach
        if look_from <= start:
            return _walk(sched, start, bound)
        found = next_slot(sched, look_from)
        if found is not None and found < bound:
            return _walk(sched, found, bound)
        reach *= 2


def _walk(sched: Any, slot: int, bound: int) -> int:
    """The last slot before ``bound`` going forward from ``slot`` (bounded)."""
    for _ in range(_MAX_WALK):
        following = next_slot(sched, slot)
        if following is None or following >= bound:
            return slot
        slot = following
    return slot


@dataclass(frozen=True)
class Plan:
    """What a leader does with an entry now: ``catch_up`` the most recent slot that came
    due before ``since`` (``missed`` slots in all came due then, from ``first_missed``);
    ``due`` the slots that came due since, in order; ``next`` the first slot still to come
    (None: none)."""

    due: list[int] = field(default_factory=list)
    next: int | None = None
    catch_up: int | None = None
    first_missed: int | None = None
    missed: int = 0


def _count(sched: Any, first: int, last: int) -> int:
    """How many slots lie from ``first`` to ``last`` (both slots); walked for a schedule
    that is not an interval, at most ``_MAX_WALK``."""
    period = interval_ms(sched)
    if period is not None:
        return (last - first) // period + 1
    count, slot = 1, first
    while slot < last and count < _MAX_WALK:
        following = next_slot(sched, slot)
        if following is None:
            break
        slot, count = following, count + 1
    return count


def plan(sched: Any, start: int | None, now: int, since: int, limit: int = MAX_DUE) -> Plan:
    """The plan for the slots from ``start`` (the entry's first slot not taken yet) at
    server time ``now``: slots before ``since`` are missed, the most recent of them is
    ``catch_up``; slots from ``since`` to ``now`` are ``due`` (at most ``limit``: older
    ones count as missed too)."""
    if start is None or start > now:
        return Plan(next=start)
    catch_up = first_missed = None
    missed = 0
    slot: int | None = start
    if start < since:
        first_missed = start
        catch_up = latest_before(sched, start, min(since, now + 1))
        missed = _count(sched, start, catch_up)
        slot = next_slot(sched, catch_up)
    due: list[int] = []
    while slot is not None and slot <= now:
        due.append(slot)
        slot = next_slot(sched, slot)
        if len(due) > limit:
            dropped = due.pop(0)
            first_missed = dropped if first_missed is None else first_missed
            catch_up, missed = dropped, missed + 1
    return Plan(due=due, next=slot, catch_up=catch_up, first_missed=first_missed, missed=missed)


def due_by_is_due(
    is_due: Callable[[dt.datetime], tuple[bool, float]], last: int | None, now: int
) -> Plan:
    """The plan of an entry whose schedule cannot name its slots (:class:`NotComputable`):
    its ``is_due(last run)`` decides, and the slot is the server time ``now`` (only ever
    after the last slot taken)."""
    due, next_in = is_due(from_ms(last) if last is not None else from_ms(now))
    following = now + max(1, int(float(next_in) * 1000))
    if due and (last is None or now > last):
        return Plan(due=[now], next=following)
    return Plan(next=following)
