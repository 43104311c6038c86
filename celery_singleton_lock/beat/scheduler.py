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
import json
import logging
import os
import secrets
import socket
import time
from dataclasses import dataclass
from typing import Any

import redis
from celery.beat import Scheduler
from celery.exceptions import CeleryCommandException, ImproperlyConfigured

from celery_singleton_lock import _observe as observe
from celery_singleton_lock.beat.config import (
    CATCH_UP_OPTION,
    BeatSettings,
    check_loop_interval,
    entry_catch_up,
    read_beat_settings,
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
from celery_singleton_lock.client import DEFAULT_SOCKET_TIMEOUT, client_from_url, mask_url
from celery_singleton_lock.config import EX_CONFIG, settings_for
from celery_singleton_lock.engine import beat as engine
from celery_singleton_lock.engine.lock import RedisLock
from celery_singleton_lock.engine.wire import LockClient, server_time
from celery_singleton_lock.exceptions import LockError, LockNotOwned

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
#: Seconds the slot records and heartbeats of a group outlive its last replica.
RECORDS_KEEP = 30 * 86400
#: A standby waits at most this long for the lease in one tick (it is woken at once when
#: the leader lets go, and tries again exactly when the leader's lease ends).
STANDBY_WAIT = 1.0


class BeatConfigError(CeleryCommandException, ImproperlyConfigured):
    """A bad ``singleton_beat_*`` setting at beat start: ``celery beat`` prints its one-line
    message and exits with status 78 (EX_CONFIG)."""


def group_key(prefix: str, group: str) -> str:
    """The leader lease of beat group ``group`` under the lock prefix; its slot records
    and heartbeats sit beside it, in its hash slot (``<prefix>:beat:{<group>}``)."""
    return f"{prefix}:beat:{{{group}}}"


class _Deposed(Exception):
    """The leader found, mid-tick, that it no longer leads."""


@dataclass
class _Known:
    """What this replica knows of an entry's slots: the last taken (ms) and a slot given
    back to be sent again (its publish failed)."""

    last: int | None = None
    retry: int | None = None


@dataclass
class _Seen:
    """An entry's schedule as the leader last saw it, and since when (server ms): slots
    before that came due before the entry (or its new schedule) existed here."""

    schedule: Any
    since: int


class LeaderScheduler(Scheduler):
    """A beat scheduler that leads a group of replicas or stands by (see the module doc).

    The wrapped scheduler (``singleton_beat_scheduler``) is built with the same arguments
    and keeps the schedule; this class only decides who sends which slot.
    """

    #: Marks this class as a wrapper (it cannot wrap itself).
    wraps_scheduler = True
    #: RedBeat's ``beat_init`` receiver takes its own lock when its scheduler has a
    #: ``lock_key``; None turns that off: this scheduler leads instead.
    lock_key = None

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        try:
            self.beat: BeatSettings = read_beat_settings(app.conf)
            configured = kwargs.get("max_interval") or app.conf.beat_max_loop_interval
            check_loop_interval(self.beat.lease, configured)
            lock_settings = settings_for(app)
            self.inner: Scheduler = self.beat.scheduler_cls(app, *args, **kwargs)
            if not kwargs.get("lazy"):
                for entry in list(self.inner.schedule.values()):
                    entry_catch_up(getattr(entry, "options", None), "once", str(entry.name))
        except ImproperlyConfigured as exc:
            message = " ".join(str(exc).split())
            raise BeatConfigError(message=message, exit_code=EX_CONFIG) from exc
        self.lease = self.beat.lease
        self.group = self.beat.name or app.main or "default"
        self.url = lock_settings.url
        self.keys = engine.BeatKeys(group_key(lock_settings.prefix, self.group))
        self.replica = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(2)}"
        # A leader renews a few times per lease; the loop never sleeps longer.
        cap = self.lease / 3
        limit = configured or self.inner.max_interval or cap
        super().__init__(app, lazy=True)
        self.max_interval: float = min(float(limit), cap)  # type: ignore[assignment]
        self._client: LockClient | None = None
        self._lock: RedisLock | None = None
        self._leading = False
        self._fence = 0
        self._token = ""
        self._since = 0
        self._renewed_at = 0.0
        self._heartbeat_due = 0.0
        self._known: dict[str, _Known] = {}
        self._seen: dict[str, _Seen] = {}
        self._held_back: dict[str, int] = {}
        self._warned: set[str] = set()
        self._ticking = False
        self._closed = False
        self._ticked = False  # the first tick of this leadership term is done

    # -- what beat's Service and banner use -------------------------------------------------

    def _get_schedule(self) -> Any:
        return self.inner.schedule

    def _set_schedule(self, schedule: Any) -> None:
        self.inner.schedule = schedule

    schedule = property(_get_schedule, _set_schedule)

    def setup_schedule(self) -> None:
        """The wrapped scheduler sets up its schedule itself."""

    def should_sync(self) -> bool:
        return bool(self.inner.should_sync())

    def _do_sync(self) -> None:
        inner: Any = self.inner  # Celery's own private method, which beat's Service calls
        inner._do_sync()

    def sync(self) -> None:
        self.inner.sync()

    @property
    def info(self) -> str:
        theirs = str(self.inner.info or "")
        ours = (
            f"    . leader -> group {self.group!r} on {mask_url(self.url)}, lease "
            f"{self.lease:g}s, catch-up {self.beat.catch_up!r}, wrapping "
            f"{type(self.inner).__module__}.{type(self.inner).__name__}"
        )
        return f"{theirs}\n{ours}" if theirs else ours

    @property
    def leading(self) -> bool:
        """Whether this replica leads its group (as of its last tick)."""
        return self._leading

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

    def _warn(self, what: str, message: str, *args: Any) -> None:
        """Log ``message`` at WARNING the first time in a row, at DEBUG while it repeats."""
        level = logging.DEBUG if what in self._warned else logging.WARNING
        self._warned.add(what)
        log.log(level, message, *args)

    def _setup(self) -> tuple[LockClient, RedisLock]:
        """The lock client and the leader lease, built in the process that ticks."""
        if self._client is None or self._lock is None:
            timeout = min(DEFAULT_SOCKET_TIMEOUT, max(0.5, self.lease / 2))
            transport = self.app.conf.get("broker_transport_options") or {}
            self._client = client_from_url(self.url, transport.get("master_name"), timeout)
            info = {"host": socket.gethostname(), "pid": os.getpid(), "beat": self.replica}
            self._lock = RedisLock(self._client, self.keys.leader, self.lease, holder_info=info)
        return self._client, self._lock

    def _heartbeat(self, *, force: bool = False) -> int | None:
        """Say this replica is alive (at most once a second unless ``force``) and refresh
        what it knows of the slot records; the server time (ms), or None when skipped."""
        now = time.monotonic()
        if not force and now < self._heartbeat_due:
            return None
        client, _ = self._setup()
        info = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "role": "leader" if self._leading else "standby",
            "since": self._since if self._leading else None,
            "fence": self._fence if self._leading else None,
        }
        server_ms, records = engine.presence(
            client,
            self.keys,
            replica=self.replica,
            info=json.dumps(info, sort_keys=True),
            ttl_ms=int((2 * self.lease + 2) * 1000),
            keep_ms=RECORDS_KEEP * 1000,
        )
        self._heartbeat_due = now + min(STANDBY_WAIT, self.lease / 4)
        self._learn(records)
        return server_ms

    def _learn(self, records: dict[str, engine.Record]) -> None:
        """Take in the slot records read from the lock Redis; a replica's own knowledge is
        kept where it is ahead (the lock Redis lost its data)."""
        for name, record in records.items():
            known = self._known.setdefault(name, _Known())
            taken = record.last_taken
            if taken is not None and (known.last is None or taken >= known.last):
                known.last = taken
                known.retry = record.slot if record.state == engine.GIVEN_BACK else None

    # -- standing by -----------------------------------------------------------------------

    def _stand_by(self) -> float:
        _, lock = self._setup()
        self._heartbeat()
        started = time.monotonic()
        wait = min(STANDBY_WAIT, self.lease / 4)
        if lock.acquire(blocking=True, timeout=wait):
            try:
                self._elect(lock)
            except BaseException:
                # Taken but not led on (the lock Redis failed mid-election, or beat stops):
                # a hold kept here would run out unused and make every later acquire of
                # this replica fail ("already holds it"), so it never led again.
                self._let_go(lock)
                raise
            return 0.0
        return max(0.0, wait - (time.monotonic() - started))

    def _let_go(self, lock: RedisLock) -> None:
        """Give back a lease this replica took but does not lead on, so another replica
        can lead at once; the hold is forgotten here whatever the lock Redis answers (if
        it cannot be told, the lease runs out)."""
        try:
            lock.release()
        except LockError as exc:
            log.debug("beat: could not give the leader lease back (%s); it runs out", exc)

    def _elect(self, lock: RedisLock) -> None:
        """Lead on the lease just taken: once the lock Redis shows it as ours and this
        replica has read the slot records, and not before (an error on the way leaves it
        standing by)."""
        acquired_at = time.monotonic()
        token, fence = lock.token, lock.fencing_token
        holder = lock.holder()
        if not token or not fence or holder is None or holder.token != token:
            # Never lead on a hold the lock Redis does not show as ours (it ran out while
            # this process was frozen, say): its claims would be refused anyway.
            log.error(
                "beat: acquired the leader lease but the lock Redis shows %s (token %s, "
                "fencing token %s): not leading",
                holder,
                token,
                fence,
            )
            self._let_go(lock)
            return
        before = {name: known.last for name, known in self._known.items()}
        client, _ = self._setup()
        now_ms, records = engine.presence(
            client,
            self.keys,
            replica=self.replica,
            info=json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "role": "leader"}),
            ttl_ms=int((2 * self.lease + 2) * 1000),
            keep_ms=RECORDS_KEEP * 1000,
        )
        self._fence = fence
        self._token = token
        self._renewed_at = acquired_at
        self._since = now_ms
        self._heartbeat_due = 0.0  # the next heartbeat says since when it leads
        lost = [name for name, last in before.items() if last is not None and name not in records]
        if lost:
            log.warning(
                "beat: the lock Redis has no slot record of %d entr%s this replica saw "
                "taken (%s): it lost its data (a restart or failover); carrying on from "
                "the last slots this replica saw",
                len(lost),
                "y" if len(lost) == 1 else "ies",
                ", ".join(sorted(lost)[:5]),
            )
        self._learn(records)
        self._held_back.clear()
        self._ticked = False
        self._leading = True
        log.info(
            "beat: %s leads group %r (fencing token %d, lease %gs)",
            self.replica,
            self.group,
            self._fence,
            self.lease,
        )
        observe.elected(
            self,
            group=self.group,
            replica=self.replica,
            fencing_token=self._fence,
            since=from_ms(now_ms),
        )

    def _depose(self, reason: str) -> None:
        """Stop leading (send nothing more) and stand by again."""
        if not self._leading:
            return
        self._leading = False
        if self._lock is not None:
            self._lock.detach()
        self._heartbeat_due = 0.0
        log.warning(
            "beat: %s no longer leads group %r (fencing token %d): %s; standing by",
            self.replica,
            self.group,
            self._fence,
            reason,
        )
        observe.deposed(
            self, group=self.group, replica=self.replica, fencing_token=self._fence, reason=reason
        )

    # -- leading ---------------------------------------------------------------------------

    def _renew(self) -> bool:
        """Renew the lease (owner-checked, server clock); False when this tick must not
        send (the renewal failed but the lease may still be ours: it is tried again next
        tick, unless the lease runs out first)."""
        _, lock = self._setup()
        try:
            lock.extend()
        except LockNotOwned:
            self._depose("its lease was taken or is gone")
            return False
        except LockError as exc:
            if lock.lease_lost:
                self._depose(f"its lease ran out with no renewal confirmed ({exc})")
            else:
                self._warn("renew", "beat: renewing the leader lease failed (%s); no slot is "
                           "sent until it is renewed", exc)  # fmt: skip
            return False
        self._warned.discard("renew")
        self._renewed_at = time.monotonic()
        return True

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

    def _keep_lease(self) -> None:
        """Mid-tick: renew when a third of the lease has passed since the last renewal;
        ``_Deposed`` when the lease is no longer trusted."""
        _, lock = self._setup()
        if time.monotonic() - self._renewed_at >= self.lease / 3 and not self._renew():
            raise _Deposed("its lease could not be renewed mid-tick")
        if lock.lease_lost:
            raise _Deposed("its lease ran out with no renewal confirmed")

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

    # -- stopping --------------------------------------------------------------------------

    def close(self) -> None:
        """Let go of the lease (the next leader takes over at once), say this replica
        leaves, and close the wrapped scheduler. Called mid-tick by beat's signal handler,
        it waits for the end of the tick (beat calls it again as it stops)."""
        if self._ticking:
            return
        if not self._closed and self._lock is not None and self._client is not None:
            self._closed = True
            if self._leading:
                fence = self._fence
                try:
                    self._lock.release()
                except LockError as exc:
                    log.warning("beat: could not let go of the leader lease: %s", exc)
                self._leading = False
                observe.deposed(
                    self, group=self.group, replica=self.replica, fencing_token=fence,
                    reason="it stopped",
                )  # fmt: skip
            try:
                engine.leave(self._client, self.keys, replica=self.replica,
                             keep_ms=RECORDS_KEEP * 1000)  # fmt: skip
            except LockError as exc:
                log.debug("beat: could not remove this replica's heartbeat: %s", exc)
        self.inner.close()
