"""Background threads that extend the leases of auto-renewing locks.

Locks are renewed in *lanes*, one per Redis connection pool (one per server, or per
cluster node): each lane is a min-heap of due times served by a daemon thread of its own,
so a stalled server holds up only the renewals of locks on that server. A lock registers
its hold when acquired; the lane first extends it a third of a lease later, so a short
critical section costs no thread start and no extra round trip.

Ended holds are not searched for: they are dropped when they reach the top of the heap,
so each hold costs O(log n) however many are held. Holds due at the same moment are handed
to their lock class together, which extends them in one pipelined round trip where it can.
Lanes hold only weak references to locks (a lock garbage collected without release stops
being renewed and expires), end their thread after a while without work, and are rebuilt
in a forked child.

:class:`Renewing` is the renewal half of ``RedisLock`` (a mixin it inherits): which lane
serves a lock and a batch of due renewals in one round trip. One renewal, and what its
reply means for the hold, are the steps both engines share (:class:`.steps.LockSteps`).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
import weakref
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any, Protocol, cast

import redis
from redis.cluster import RedisCluster

from celery_singleton_lock.engine.holds import Hold
from celery_singleton_lock.engine.scripted import ScriptedProtocol, extend_all

if TYPE_CHECKING:
    from celery_singleton_lock.engine.protocol import Protocol as WireProtocol
    from celery_singleton_lock.engine.wire import LockClient

__all__ = ["RENEW_DIVISOR", "Renewable", "Renewing", "renewer"]

log = logging.getLogger("celery_singleton_lock.renewer")

#: A lane's thread ends after this many seconds with nothing to renew.
IDLE_SECONDS = 30.0
#: An idle lane's thread wakes at least this often (or as often as its shortest renewal
#: delay, if longer), so that registering a hold seldom has to wake it.
IDLE_TICK = 1.0
#: Renew every lease / this; retry a failed renewal after a quarter of what is left.
RENEW_DIVISOR = 3
MIN_RENEW_RETRY = 0.05

#: The most holds a lane renews in one go (one pipelined round trip where it can).
BATCH = 500


class Renewable(Protocol):
    """What a lane needs from a lock."""

    @classmethod
    def _renew_all(cls, due: list[tuple[Any, Any]]) -> list[float | None]:
        """Extend each ``(lock, hold)`` of ``due``; per hold the delay until its next
        renewal, or None to stop."""


_Entry = tuple[float, int, "weakref.ref[Renewable]", Any]


def _dead(entry: _Entry) -> bool:
    return bool(entry[3].ended) or entry[2]() is None


class _Lane:
    """The renewals of one connection pool: a heap of (due time, hold) and its thread."""

    def __init__(self, owner: _Renewer, key: Hashable) -> None:
        self._owner = owner
        self._key = key
        self._cond = threading.Condition()
        self._heap: list[_Entry] = []
        self._seq = itertools.count()
        self._sleeping_until = float("inf")  # what the thread's current wait aims at
        # The shortest delay pushed yet: an idle thread wakes at least this often, so a
        # push (whose due time is at least that far off) need not wake it.
        self._min_delay = float("inf")
        self._thread = threading.Thread(target=self._run, name="csl-lock-renewer", daemon=True)
        self._thread.start()

    def push(self, lock: Renewable, hold: Any, delay: float) -> None:
        due = time.monotonic() + delay
        with self._cond:
            self._min_delay = min(self._min_delay, delay)
            heapq.heappush(self._heap, (due, next(self._seq), weakref.ref(lock), hold))
            if due < self._sleeping_until:
                self._cond.notify()  # sooner than what the thread sleeps towards

    def _next(self) -> list[_Entry] | None:
        """The entries due now (at least one, at most ``BATCH``); None once the lane has
        been idle long enough to close."""
        idle_since = time.monotonic()
        while True:
            with self._cond:
                while self._heap and _dead(self._heap[0]):
                    heapq.heappop(self._heap)
                now = time.monotonic()
                if self._heap:
                    idle_since = now
                    wait = self._heap[0][0] - now
                    if wait <= 0:
                        self._sleeping_until = float("-inf")  # awake: nobody need notify
                        due = [heapq.heappop(self._heap)]
                        while self._heap and self._heap[0][0] <= now and len(due) < BATCH:
                            due.append(heapq.heappop(self._heap))
                        return due
                else:
                    wait = IDLE_SECONDS - (now - idle_since)
                    if wait > 0:
                        wait = min(wait, max(self._min_delay, IDLE_TICK))
                if wait > 0:
                    self._sleeping_until = now + wait
                    self._cond.wait(wait)
                    continue
            # Idle long enough. Retire outside our condition: the lock order is renewer
            # mutex, then lane condition (as in schedule).
            if self._owner.retire(self):
                return None
            idle_since = time.monotonic()

    def _run(self) -> None:
        while True:
            entries = self._next()
            if entries is None:
                return
            self._renew(entries)

    def _renew(self, entries: list[_Entry]) -> None:
        """Renew the holds of ``entries`` still alive, by lock class, and queue each one's
        next renewal (the locks are only referenced until this returns)."""
        by_type: dict[type[Renewable], list[tuple[Renewable, Any]]] = {}
        for entry in entries:
            lock = entry[2]()
            if lock is not None and not entry[3].ended:
                by_type.setdefault(type(lock), []).append((lock, entry[3]))
        for kind, due in by_type.items():
            try:
                delays = kind._renew_all(due)
            except Exception:  # the thread must outlive any one lock's failure
                log.exception("lock renewal crashed")
                delays = [None] * len(due)
            for (lock, hold), delay in zip(due, delays, strict=True):
                if delay is not None:
                    self.push(lock, hold, delay)


class _Renewer:
    """The lanes of this process, by connection-pool key."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._lanes: dict[Hashable, _Lane] = {}
        self._pid = os.getpid()

    def schedule(self, lane: Hashable, lock: Renewable, hold: Any, delay: float) -> None:
        """Renew ``hold`` of ``lock`` after ``delay`` seconds, in the lane of ``lane`` (the
        lock's connection pool), until the hold ends."""
        with self._mutex:
            if self._pid != os.getpid():  # forked: the parent's threads do not exist here
                self._lanes = {}
                self._pid = os.getpid()
            found = self._lanes.get(lane)
            if found is None:
                found = self._lanes[lane] = _Lane(self, lane)
            found.push(lock, hold, delay)

    def retire(self, lane: _Lane) -> bool:
        """Close ``lane`` if it is still empty (called by its own thread); False when work
        arrived meanwhile."""
        with self._mutex:
            with lane._cond:
                if lane._heap:
                    return False
            if self._lanes.get(lane._key) is lane:
                del self._lanes[lane._key]
            return True

    def lanes(self) -> int:
        """How many lanes (renewer threads) this process runs now."""
        with self._mutex:
            return len(self._lanes)


renewer = _Renewer()


def _reset_renewer_in_child() -> None:
    """A forked child runs none of its parent's lanes, and a parent thread may have held the
    renewer's mutex at the fork: start afresh."""
    renewer._mutex = threading.Lock()
    renewer._lanes = {}
    renewer._pid = os.getpid()


os.register_at_fork(after_in_child=_reset_renewer_in_child)


class Renewing:
    """The renewal half of ``RedisLock``, which inherits it: the lane a lock is renewed in
    and a batch of due renewals (one renewal and the judgement of its reply are
    :class:`.steps.LockSteps`'). The attributes declared here are set by ``RedisLock``."""

    client: LockClient
    name: str
    timeout: float
    auto_renew: bool
    replicas: int
    protocol: WireProtocol
    _lease_ms: int

    if TYPE_CHECKING:

        def _renew(self, hold: Hold) -> float | None:
            """Extend ``hold``'s lease; the delay until its next renewal, or None to stop
            (``steps.LockSteps._renewal``, run by ``RedisLock``)."""

        def _renewal_reply(
            self, hold: Hold, started: float, reply: int | BaseException
        ) -> float | None:
            """What a renewal's reply means for ``hold`` (``steps.LockSteps``)."""

    def _start_renewal(self, hold: Hold) -> None:
        """Renew ``hold`` a third of a lease from now, and on, until it ends."""
        renewer.schedule(self._lane(), self, hold, self.timeout / RENEW_DIVISOR)

    # -- called by a renewer lane's thread ---------------------------------------------------

    def _lane(self) -> Hashable:
        """Which renewer lane serves this lock: one per connection pool (per cluster node),
        so a stalled server delays only the renewals of locks on it."""
        if isinstance(self.client, RedisCluster):
            node = cast("Any", self.client).get_node_from_key(self.name)  # untyped
            return (self.client, node.name)
        return cast("Hashable", getattr(self.client, "connection_pool", self.client))

    @classmethod
    def _renew_all(cls, due: list[tuple[Renewing, Hold]]) -> list[float | None]:
        """Extend every hold in ``due`` (all on one connection pool; the delays until their
        next renewals, None to stop): the scripted, unreplicated ones of a plain client in
        one pipelined round trip, the others one by one."""
        delays: list[float | None] = [None] * len(due)
        batch: list[int] = []
        for index, (lock, hold) in enumerate(due):
            if (
                type(lock.protocol) is ScriptedProtocol
                and not lock.replicas
                and type(lock.client) is redis.Redis
                and lock.auto_renew
                and not hold.ended
                and not lock.protocol.stacked
            ):
                batch.append(index)
            else:
                delays[index] = lock._renew(hold)
        if batch:
            client = cast("redis.Redis", due[batch[0]][0].client)  # a plain client: checked
            started = time.monotonic()
            replies = extend_all(
                client,
                [
                    (due[i][0].name, due[i][1].key, due[i][1].token, due[i][0]._lease_ms)
                    for i in batch
                ],
            )
            for index, reply in zip(batch, replies, strict=True):
                lock, hold = due[index]
                delays[index] = lock._renewal_reply(hold, started, reply)
        return delays
