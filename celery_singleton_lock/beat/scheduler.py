"""``LeaderScheduler``: several ``celery beat`` replicas, one leader, each schedule slot sent
once.

Run every replica with ``celery beat -S celery_singleton_lock.beat:LeaderScheduler``. Each
wraps a scheduler of its own (``singleton_beat_scheduler``: Celery's
``PersistentScheduler`` by default), which keeps the schedule: its entries, their changes
at run time, their persistence. The wrapper decides who sends and what:

- A *standby* tries, at each tick, to take the group's leader lease (a
  :class:`~celery_singleton_lock.engine.lock.RedisLock`, waiting at most a second, woken
  when the leader lets go) and otherwise heartbeats; it keeps trying for ever, so someone
  leads again after any failure, a restart of the lock Redis included.
- The *leader* renews its lease (owner-checked, on the server's clock) at the start of
  every tick, before any send; a renewal that finds the lease taken, or that cannot be
  confirmed before the lease runs out, ends its leadership at once and it stands by again.
- Each slot (entry, scheduled time) is taken by one script that checks, in the same step,
  that the caller's fencing token is the lease's and that the slot is later than the
  entry's last slot taken (:mod:`..engine.beat`); only then is the task published, by the
  wrapped scheduler's ``apply_async`` (the normal publish: queue-scope locks still
  deduplicate). A publish that fails gives the slot back (it is sent at the next tick,
  by the catch-up rule); a leader killed between taking a slot and publishing it loses
  that one slot (at most once wins).
- Slots are derived from the schedule and the last slot taken, kept in the lock Redis
  (:mod:`.slots`), never from a replica's own ``last_run_at``. Slots that came due while
  nobody led follow ``singleton_beat_catch_up``: ``"once"`` sends the most recent of them,
  ``"skip"`` none.
"""

from __future__ import annotations

import copy
import logging
import time
from typing import Any

import redis

from celery_singleton_lock import _observe as observe
from celery_singleton_lock.beat.config import CATCH_UP_OPTION, entry_catch_up
from celery_singleton_lock.beat.replica import (
    RECORDS_KEEP,
    STANDBY_WAIT,
    BeatConfigError,
    Replica,
    _Deposed,
    _Known,
    _Seen,
    group_key,
)
from celery_singleton_lock.beat.slots import (
    NotComputable,
    Plan,
    due_by_is_due,
    from_ms,
    next_slot,
    plan,
    to_ms,
)
from celery_singleton_lock.client import mask_url
from celery_singleton_lock.config import EX_CONFIG
from celery_singleton_lock.engine import beat as engine
from celery_singleton_lock.engine.wire import LockClient, server_time
from celery_singleton_lock.exceptions import LockError

__all__ = [
    "EX_CONFIG",
    "HEADER",
    "RECORDS_KEEP",
    "BeatConfigError",
    "LeaderScheduler",
    "group_key",
]

log = logging.getLogger("celery_singleton_lock.beat")

#: The message header that tells a task which slot it was sent for (see ``scheduled_slot``).
HEADER = "csl_beat"


class LeaderScheduler(Replica):
    """A beat scheduler that leads a group of replicas or stands by (see the module doc):
    what a tick does and how a leader sends slots, on the lease and the state of its
    :class:`~celery_singleton_lock.beat.replica.Replica` half.

    The wrapped scheduler (``singleton_beat_scheduler``) is built with the same arguments
    and keeps the schedule; this class only decides who sends which slot.
    """

    # -- the tick --------------------------------------------------------------------------

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """One pass: lead (renew, then send what is due) or stand by (try to lead). The
        seconds until the next pass."""
        self._ticking = True
        try:
            if self._leading:
                return self._lead()
            return self._stand_by()
        except (LockError, redis.RedisError) as exc:
            self._warn("redis", "beat: the lock Redis at %s failed: %s", mask_url(self.url), exc)
            return min(STANDBY_WAIT, self.lease / 4)
        finally:
            self._ticking = False

    # -- leading ---------------------------------------------------------------------------

    def _lead(self) -> float:
        retry = min(STANDBY_WAIT, self.lease / 4)
        if not self._renew():
            return 0.0 if not self._leading else retry
        client, _ = self._setup()
        self._heartbeat()
        now_ms = server_time(client, self.keys.leader)[0]
        wake = float(self.max_interval)
        try:
            for entry in list(self.schedule.values()):
                following = self._entry_tick(entry, now_ms)
                if following is not None:
                    wake = min(wake, max(0.0, (following - now_ms) / 1000 + 0.002))
        except _Deposed as exc:
            self._depose(str(exc))
            return 0.0
        self._ticked = True
        self._warned.discard("redis")
        return wake

    def _since_of(self, name: str, schedule: Any, now_ms: int) -> int:
        """Slots of ``name`` before this (server ms) were missed: they came due before this
        leader led, before the entry (or its current schedule) was seen, or before its
        publish last failed."""
        seen = self._seen.get(name)
        try:
            changed = seen is None or seen.schedule != schedule
        except Exception:  # noqa: BLE001 - a schedule whose comparison fails: take it as new
            changed = True
        if changed:
            if seen is not None:
                log.info("beat: the schedule of %r changed to %r", name, schedule)
            # An entry first seen as a term begins is judged from the election on; one that
            # appears later, or whose schedule changes, from now on.
            fresh = seen is None and not self._ticked
            seen = self._seen[name] = _Seen(schedule, 0 if fresh else now_ms)
        assert seen is not None
        return max(self._since, seen.since, self._held_back.get(name, 0))

    def _plan(self, entry: Any, now_ms: int, since: int) -> Plan:
        """The plan of ``entry`` at ``now_ms`` (see :func:`.slots.plan`)."""
        known = self._known.get(entry.name, _Known())
        schedule = entry.schedule
        try:
            if known.retry is not None:
                start: int | None = known.retry
            elif known.last is not None:
                start = next_slot(schedule, known.last)
            else:
                last_run = getattr(entry, "last_run_at", None)
                anchor = to_ms(schedule.maybe_make_aware(last_run)) if last_run else now_ms
                start = next_slot(schedule, anchor)
            return plan(schedule, start, now_ms, since)
        except NotComputable:
            last = known.last
            if last is None and getattr(entry, "last_run_at", None) is not None:
                last = to_ms(schedule.maybe_make_aware(entry.last_run_at))
            return due_by_is_due(schedule.is_due, last, now_ms)

    def _entry_tick(self, entry: Any, now_ms: int) -> int | None:
        """Send what is due of ``entry``; its next slot (ms), None when it has none."""
        name = entry.name
        try:
            since = self._since_of(name, entry.schedule, now_ms)
            found = self._plan(entry, now_ms, since)
            rule = entry_catch_up(getattr(entry, "options", None), self.beat.catch_up, name)
        except _Deposed:
            raise
        except Exception as exc:  # noqa: BLE001 - one bad entry must not stop the others
            self._warn(f"entry:{name}", "beat: cannot work out the slots of %r: %s", name, exc)
            return None
        self._warned.discard(f"entry:{name}")
        if found.catch_up is not None:
            self._catch_up(entry, found, rule, now_ms)
        for slot in found.due:
            self._take(entry, slot, send=True)
        return found.next

    def _catch_up(self, entry: Any, found: Plan, rule: str, now_ms: int) -> None:
        """Apply catch-up rule ``rule`` to the slots ``found`` says came due while nobody
        led: send the most recent one (``"once"``) or take it as skipped (``"skip"``)."""
        assert found.catch_up is not None
        assert found.first_missed is not None
        unsent = found.missed - (1 if rule == "once" else 0)
        if rule == "once":
            self._take(entry, found.catch_up, send=True, missed=found.missed, now_ms=now_ms)
        else:
            self._take(entry, found.catch_up, send=False)
        if unsent > 0:
            log.info(
                "beat: %d slot(s) of %r came due while nobody led and are not sent (%s to %s, "
                "catch-up %r)",
                unsent,
                entry.name,
                from_ms(found.first_missed).isoformat(),
                from_ms(found.catch_up).isoformat(),
                rule,
            )
            observe.slots_missed(
                self,
                group=self.group,
                entry=entry.name,
                first=from_ms(found.first_missed),
                last=from_ms(found.catch_up),
                count=unsent,
                catch_up=rule,
            )

    def _take(self, entry: Any, slot: int, *, send: bool, missed: int = 0, now_ms: int = 0) -> None:
        """Take slot ``slot`` of ``entry`` (and publish it, with ``send``). ``missed`` > 0:
        it is sent by the catch-up rule."""
        self._keep_lease()
        client, lock = self._setup()
        name = entry.name
        claim = engine.claim(
            client,
            self.keys,
            token=self._token,
            fence=self._fence,
            entry=name,
            slot_ms=slot,
            send=send,
            keep_ms=RECORDS_KEEP * 1000,
        )
        known = self._known.setdefault(name, _Known())
        if not claim.leads:
            raise _Deposed("the lock Redis says its lease is no longer its own")
        if not claim.taken:
            record = claim.record
            if record is not None:
                known.last, known.retry = record.last_taken, None
                if record.state == engine.GIVEN_BACK:
                    known.retry = record.slot
            log.info(
                "beat: slot %s of %r was taken already; not sent", from_ms(slot).isoformat(), name
            )
            observe.slot_skipped(
                self,
                group=self.group,
                entry=name,
                scheduled=from_ms(slot),
                taken_by=record.fence if record is not None else 0,
            )
            return
        known.last, known.retry = slot, None
        if not send:
            return
        publishing = False
        try:
            if lock.lease_lost:  # frozen since the claim: give the slot back, send nothing
                self._give_back(client, name, slot)
                raise _Deposed("its lease ran out between taking a slot and sending it")
            publishing = True
            result = self._publish(entry, slot, caught_up=missed > 0)
        except _Deposed:
            raise
        except Exception as exc:  # noqa: BLE001 - SchedulingError, or a broken inner scheduler
            log.error(
                "beat: sending slot %s of %r failed: %s", from_ms(slot).isoformat(), name, exc
            )
            self._give_back(client, name, slot)
            return
        except BaseException:
            # Stopped (SystemExit from beat's signal handler) before the publish began: the
            # slot is given back. Stopped during it, nobody knows: it stays taken.
            if not publishing:
                self._give_back(client, name, slot)
            raise
        try:
            engine.settle(client, self.keys, entry=name, slot_ms=slot, fence=self._fence, sent=True)
        except LockError as exc:  # the record stays "claimed": it counts as taken all the same
            log.warning(
                "beat: could not record slot %s of %r as sent: %s",
                from_ms(slot).isoformat(),
                name,
                exc,
            )
        try:
            self.inner.reserve(entry)  # the wrapped scheduler's bookkeeping (last run, count)
        except Exception:  # its bookkeeping must not stop the sends
            log.debug("beat: the wrapped scheduler could not record the run of %r", name,
                      exc_info=True)  # fmt: skip
        task_id = getattr(result, "id", None)
        observe.slot_sent(
            self,
            group=self.group,
            entry=name,
            scheduled=from_ms(slot),
            fencing_token=self._fence,
            task_id=str(task_id) if task_id is not None else None,
            caught_up=missed > 0,
        )
        if missed > 0:
            late = max(0.0, (now_ms - slot) / 1000)
            log.info(
                "beat: caught up slot %s of %r (%.1fs late)", from_ms(slot).isoformat(), name, late
            )
            observe.slot_caught_up(
                self, group=self.group, entry=name, scheduled=from_ms(slot), late=late,
                missed=missed,
            )  # fmt: skip

    def _give_back(self, client: LockClient, name: str, slot: int) -> None:
        """A claimed slot was not published: give it back, so the next tick offers it to
        the catch-up rule (never a burst of everything missed meanwhile)."""
        known = self._known.setdefault(name, _Known())
        try:
            engine.settle(
                client, self.keys, entry=name, slot_ms=slot, fence=self._fence, sent=False
            )
        except LockError as exc:
            log.error("beat: slot %s of %r was not sent and could not be given back (%s): it is "
                      "lost", from_ms(slot).isoformat(), name, exc)  # fmt: skip
            return
        known.retry = slot
        # Later slots that come due meanwhile are missed: the next tick sends one of them.
        self._held_back[name] = slot + 1

    def _publish(self, entry: Any, slot: int, *, caught_up: bool) -> Any:
        """Publish ``entry``'s task through the wrapped scheduler (its ``apply_async``), with
        the slot in header ``csl_beat``."""
        options = dict(getattr(entry, "options", None) or {})
        options.pop(CATCH_UP_OPTION, None)
        headers = dict(options.get("headers") or {})
        headers[HEADER] = {
            "group": self.group,
            "entry": entry.name,
            "slot": slot,
            "replica": self.replica,
            "fence": self._fence,
            "caught_up": caught_up,
            "sent_at": time.time(),
        }
        options["headers"] = headers
        sending = copy.copy(entry)
        sending.options = options
        log.info("Scheduler: Sending due task %s (%s), slot %s%s", entry.name, entry.task,
                 from_ms(slot).isoformat(), " (caught up)" if caught_up else "")  # fmt: skip
        return self.inner.apply_async(sending, producer=self.inner.producer, advance=False)
