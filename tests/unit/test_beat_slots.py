"""Slot arithmetic of beat replicas (``celery_singleton_lock.beat.slots``), pure: the slot
after a time is derived from the schedule alone (every replica gets the same), missed slots
collapse to the most recent one, and nothing depends on the clock of the process."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from celery import Celery
from celery.schedules import BaseSchedule, crontab, schedule

from celery_singleton_lock.beat.slots import (
    NotComputable,
    due_by_is_due,
    from_ms,
    latest_before,
    next_slot,
    plan,
    to_ms,
)

app = Celery("slots", set_as_current=False)
app.conf.timezone = "Europe/Paris"
app.conf.enable_utc = True


def ms(text: str) -> int:
    return to_ms(dt.datetime.fromisoformat(text))


def test_ms_round_trip() -> None:
    """Milliseconds and aware UTC datetimes convert both ways; naive means UTC."""
    moment = dt.datetime(2026, 3, 1, 12, 0, 0, 250000, tzinfo=dt.timezone.utc)
    assert from_ms(to_ms(moment)) == moment
    assert to_ms(moment.replace(tzinfo=None)) == to_ms(moment)


def test_interval_slots_continue_the_grid_of_the_last_slot() -> None:
    """``schedule(run_every=1)``: the next slot is the last one plus the period, whatever
    the time it is asked at."""
    every = schedule(dt.timedelta(seconds=1), app=app)
    assert next_slot(every, 1_000_123) == 1_001_123
    assert next_slot(schedule(dt.timedelta(minutes=5), app=app), 0) == 300_000


def test_crontab_slots_are_its_fire_times_in_its_timezone() -> None:
    """A crontab's next slot is its next fire time after the given time, in the app's
    timezone (09:30 in Paris is 08:30 UTC in winter), from any starting point."""
    cron = crontab(minute="30", hour="9", app=app)
    after = ms("2026-01-10T08:00:00+00:00")
    assert from_ms(next_slot(cron, after) or 0) == dt.datetime.fromisoformat(
        "2026-01-10T08:30:00+00:00"
    )
    assert next_slot(cron, ms("2026-01-10T08:30:00+00:00")) == ms("2026-01-11T08:30:00+00:00")
    assert next_slot(cron, ms("2026-01-10T08:17:42.500+00:00")) == ms("2026-01-10T08:30:00+00:00")


def test_the_same_slot_whatever_the_local_clock() -> None:
    """The schedule's own notion of now is pinned to the time asked about: a schedule
    whose nowfun is far off still gives the same slot."""
    cron = crontab(
        minute="*/15", app=app, nowfun=lambda: dt.datetime(2001, 1, 1, tzinfo=dt.timezone.utc)
    )
    assert next_slot(cron, ms("2026-05-05T10:07:00+00:00")) == ms("2026-05-05T10:15:00+00:00")


def test_latest_missed_slot_is_found_without_walking_every_slot() -> None:
    """The most recent slot before a bound: arithmetic for an interval (a day of 1 s slots),
    a doubling search back from the bound for a crontab."""
    every = schedule(dt.timedelta(seconds=1), app=app)
    assert latest_before(every, 5_000, 86_405_001) == 86_405_000
    assert latest_before(every, 5_000, 86_405_000) == 86_404_000
    cron = crontab(minute="0", hour="*/6", app=app)
    found = latest_before(cron, ms("2026-01-01T00:00:00+00:00"), ms("2026-03-01T05:00:00+00:00"))
    # every 6 h in Paris (UTC+1 in winter): the last before 05:00 UTC is midnight in Paris
    assert found == ms("2026-03-01T00:00:00+01:00")


def test_plan_on_time_sends_every_slot_due_since_the_election() -> None:
    """Slots that came due while this leader led are all due, in order."""
    every = schedule(dt.timedelta(seconds=1), app=app)
    found = plan(every, 10_000, now=12_500, since=9_000)
    assert found.due == [10_000, 11_000, 12_000]
    assert found.next == 13_000
    assert found.catch_up is None
    assert found.missed == 0


def test_plan_collapses_missed_slots_to_the_most_recent() -> None:
    """Slots before ``since`` (nobody led) are missed: the most recent is offered to the
    catch-up rule, never a burst; slots since are due."""
    every = schedule(dt.timedelta(seconds=1), app=app)
    found = plan(every, 10_000, now=20_500, since=18_300)
    assert found.catch_up == 18_000
    assert found.first_missed == 10_000
    assert found.missed == 9
    assert found.due == [19_000, 20_000]
    assert found.next == 21_000


def test_plan_after_a_long_outage_is_cheap() -> None:
    """A week of missed 1 s slots is one catch-up candidate (computed, not walked)."""
    every = schedule(dt.timedelta(seconds=1), app=app)
    week = 7 * 86_400_000
    found = plan(every, 1_000, now=week + 400, since=week)
    assert found.catch_up == week - 1000
    assert found.missed == week // 1000 - 1
    assert found.due == [week]


def test_plan_caps_a_burst_of_due_slots() -> None:
    """More due slots than the limit: the older ones count as missed."""
    every = schedule(dt.timedelta(seconds=1), app=app)
    found = plan(every, 1_000, now=10_000, since=0, limit=3)
    assert found.due == [8_000, 9_000, 10_000]
    assert found.catch_up == 7_000
    assert found.missed == 7


def test_plan_of_a_crontab_after_an_outage() -> None:
    """Every 15 minutes, nobody led for a day: the most recent missed slot only."""
    cron = crontab(minute="*/15", app=app)
    start = ms("2026-02-01T00:15:00+00:00")
    found = plan(
        cron, start, now=ms("2026-02-02T00:20:00+00:00"), since=ms("2026-02-02T00:10:00+00:00")
    )
    assert found.catch_up == ms("2026-02-02T00:00:00+00:00")
    assert found.missed == 96
    assert found.due == [ms("2026-02-02T00:15:00+00:00")]
    assert found.next == ms("2026-02-02T00:30:00+00:00")


def test_nothing_due_before_the_first_slot() -> None:
    """A plan whose first slot is still to come sends nothing and names it."""
    every = schedule(dt.timedelta(seconds=5), app=app)
    assert plan(every, 9_000, now=8_000, since=0).due == []
    assert plan(every, 9_000, now=8_000, since=0).next == 9_000
    assert plan(every, None, now=8_000, since=0).next is None


class OnlyIsDue(BaseSchedule):
    """A user's schedule that implements ``is_due`` only."""

    def is_due(self, last_run_at: dt.datetime) -> Any:
        return (True, 7.0)


def test_a_schedule_that_cannot_name_its_slots_falls_back_to_is_due() -> None:
    """``NotComputable`` for a schedule without ``remaining_estimate``; its ``is_due``
    then decides, and the slot is the server's now, always after the last slot taken."""
    odd = OnlyIsDue(app=app)
    with pytest.raises(NotComputable):
        next_slot(odd, 0)
    found = due_by_is_due(odd.is_due, 5_000, 9_000)
    assert found.due == [9_000]
    assert found.next == 16_000
    assert due_by_is_due(odd.is_due, 9_000, 9_000).due == []


class Frozen(BaseSchedule):
    """A schedule that reads the time from somewhere else than ``nowfun``."""

    def now(self) -> dt.datetime:
        return dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc)

    def remaining_estimate(self, last_run_at: dt.datetime) -> dt.timedelta:
        return dt.timedelta(seconds=1)


def test_a_schedule_that_ignores_nowfun_is_not_computable() -> None:
    """Pinning the time must work, else the slot would depend on the local clock."""
    with pytest.raises(NotComputable):
        next_slot(Frozen(app=app), 1_000)
