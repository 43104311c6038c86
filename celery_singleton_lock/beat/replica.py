"""A replica of a beat group: the leader lease (standing by, elected, renewed, deposed),
its heartbeat and what it knows of the group's slot records, and the wrapped scheduler's
face to beat's Service. :class:`.scheduler.LeaderScheduler` adds the tick and the sending
of slots on top.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import time
from dataclasses import dataclass
from typing import Any

from celery.beat import Scheduler
from celery.exceptions import CeleryCommandException, ImproperlyConfigured

from celery_singleton_lock import _observe as observe
from celery_singleton_lock.beat.config import (
    BeatSettings,
    check_loop_interval,
    entry_catch_up,
    read_beat_settings,
)
from celery_singleton_lock.beat.slots import from_ms
from celery_singleton_lock.client import DEFAULT_SOCKET_TIMEOUT, client_from_url, mask_url
from celery_singleton_lock.config import EX_CONFIG, settings_for
from celery_singleton_lock.engine import beat as engine
from celery_singleton_lock.engine.lock import RedisLock
from celery_singleton_lock.engine.wire import LockClient
from celery_singleton_lock.exceptions import LockError, LockNotOwned

__all__ = ["RECORDS_KEEP", "STANDBY_WAIT", "BeatConfigError", "Replica", "group_key"]

log = logging.getLogger("celery_singleton_lock.beat")

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


class Replica(Scheduler):
    """One replica of a beat group, leading it or standing by: the state and the lease half
    of :class:`~celery_singleton_lock.beat.scheduler.LeaderScheduler` (see that module's
    doc), which adds what a tick does.

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

    # -- what beat's Service and banner use ------------------------------------------------

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

    # -- the lease, while leading ----------------------------------------------------------

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

    def _keep_lease(self) -> None:
        """Mid-tick: renew when a third of the lease has passed since the last renewal;
        ``_Deposed`` when the lease is no longer trusted."""
        _, lock = self._setup()
        if time.monotonic() - self._renewed_at >= self.lease / 3 and not self._renew():
            raise _Deposed("its lease could not be renewed mid-tick")
        if lock.lease_lost:
            raise _Deposed("its lease ran out with no renewal confirmed")

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
