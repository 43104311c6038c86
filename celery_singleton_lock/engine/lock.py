"""``RedisLock``: the SETNX/GETSET expiry-timestamp lock, made safe.

The key's value says until when the lock is held (Redis server milliseconds), who holds
it (an owner token) and with which fencing token. Acquire is SETNX, else take over an
expired value; release and extend act only for the owner. How each step reaches Redis is
a :class:`~celery_singleton_lock.engine.protocol.Protocol`: Lua scripts by default, the classic
plain commands with ``scripting=False``.

Ownership belongs to one *hold* (one successful acquire), never to the object: each hold
gets an owner token of its own, so a thread that shares an instance with the holder, or a
child process forked while it was held, contends like any other client.

Waiters queue up and block (BLPOP); a release hands the lock straight to the first live
waiter (scripted mode) or wakes one (plain mode), so a hand-off costs no sleep and, with
scripts, no further round trip. The BLPOP timeout doubles as the fallback poll that notices
a crashed holder's lease running out. This module imports nothing from Celery.

This module is the public API and waiting; a hold is a :class:`~.holds.Hold`, and the lease
renewal ``RedisLock`` inherits from :class:`~.renewal.Renewing`. Its decisions that need no
I/O (argument checks, the waiting arithmetic, which hold a call is about, reading the
server's answers) are :mod:`~.rules`, shared with the asyncio engine (:mod:`~.aio`).
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
import weakref
from types import TracebackType
from typing import Any, ClassVar, cast

from redis.cluster import RedisCluster

from celery_singleton_lock.engine.holds import Hold, HoldView
from celery_singleton_lock.engine.keyspace import OWNERS, SIGNAL, SLOTS, SYNC, companion_key
from celery_singleton_lock.engine.plain import PlainProtocol
from celery_singleton_lock.engine.protocol import Grant, Protocol
from celery_singleton_lock.engine.renewal import Renewing
from celery_singleton_lock.engine.rules import (
    Next,
    acquire_mode,
    check_lock,
    ensure_held,
    fair_ms,
    hold_for,
    holder_at,
    holder_text,
    holders_at,
    lease_ms,
    newest,
    next_step,
    owns,
    poll_cap,
    reply_lost,
    slot_held_by,
    slot_key,
    slot_number,
    slot_numbers,
    value_of,
    wait_for,
)
from celery_singleton_lock.engine.scripted import ScriptedProtocol
from celery_singleton_lock.engine.stack import Stack
from celery_singleton_lock.engine.value import Holder, LockValue
from celery_singleton_lock.engine.wire import (
    LockClient,
    call,
    socket_timeout,
    time_reply,
    wait_for_replicas,
)
from celery_singleton_lock.exceptions import LockBackendError, LockError, LockNotOwned

__all__ = ["Holder", "RedisLock"]

log = logging.getLogger("celery_singleton_lock.engine.lock")

#: Every live lock of this process: a forked child resets them (see ``_reset_in_child``).
_instances: weakref.WeakSet[RedisLock] = weakref.WeakSet()


def _reset_in_child() -> None:
    """In a child just forked: every lock starts afresh. A thread of the parent may have been
    inside a lock's method at the fork, holding its mutex or reservation; that thread does
    not exist here, so those locks would never be released and the child's first use of
    the instance would hang. The child holds nothing its parent held anyway."""
    for lock in list(_instances):
        lock._mutex = threading.Lock()
        lock._start_process()


os.register_at_fork(after_in_child=_reset_in_child)


class RedisLock(HoldView, Renewing):
    """A lease-based distributed lock on one Redis key.

    ``timeout`` is the lease in seconds. ``auto_renew`` keeps extending the lease while the
    lock is held (see ``lease_lost``). ``fallback_poll`` bounds how long a waiter sleeps
    without news before it looks again.

    Every hold gets a fresh owner token, so one instance shared by threads, or inherited by
    a forked child, still excludes: the others contend like any client, and the holding
    thread re-acquiring gets ``LockError``. ``release()``, ``extend()``, ``owned()``,
    ``fencing_token`` and ``lease_lost`` act on the calling thread's hold, or, from a
    thread that holds none, on the one hold this instance has in this process (a lock
    taken in one thread and released in another, as ``threading.Lock`` allows) — except
    in a thread whose acquire failed against that very hold: a contender never speaks for
    the holder it lost to.

    ``token`` fixes the owner token instead: every instance and process using that token is
    one owner (threads of one instance still take turns); an instance with a fixed token can
    release or extend that owner's hold without having acquired it. ``claim`` names another
    owner token whose hold this lock's acquire takes over atomically, fencing token
    included (how the run of a queued task takes the lock its message held);
    ``holder_info`` is a short text (or JSON-able mapping) stored with the lock for
    operators.

    ``limit`` > 1 makes it a lock with that many slots (up to ``limit`` holders at once,
    each leased, owner-checked and fenced like a single hold; scripted mode only; at most
    ``MAX_LIMIT``, 100,000: an acquire costs the same whatever the limit); a
    ``group`` (a token prefix) then never holds two slots at once, e.g. the deliveries of
    one task.

    ``replicas`` (default 0) makes every acquire and every lease extension wait until that
    many replicas of the server acknowledge it (Redis ``WAIT``), at most
    ``replicas_timeout`` seconds. When fewer acknowledge in time, an acquire is undone (an
    owner-checked release) and raises ``LockBackendError``; an extension raises
    ``LockBackendError`` without counting as confirmed, so ``lease_lost`` follows by the
    clock if it keeps failing. It narrows the window in which a failover loses a lock that
    was just granted; it does not close it (see docs/deployment.md).

    ``fair_after`` (seconds; default None: first come, first served) relaxes the order of
    waiters for throughput, as Go's ``sync.Mutex`` does: a release frees the lock for
    whoever comes first (a newcomer may take it) while the first waiter has waited less
    than ``fair_after`` since it began, and hands it straight to that waiter after. No
    waiter waits longer than ``fair_after`` plus one holder's critical section past the
    moment it became first. Scripted mode only.

    ``stack`` (an :class:`~.stack.Stack`) makes every hold also take a share of several
    counted limits at once, in the same atomic step or not at all (its weight in each; a
    limit's number may be changed in Redis while holds run). The shares are released,
    renewed and expire with the hold. A try that finds the key free but a limit full fails
    like one that finds the key held (``held_back_by`` names the limit), and a waiter is
    woken when a share of that limit is given back. ``name`` must carry the stack's hash
    tag. Scripted mode only.
    """

    #: The protocol for each value of ``scripting``; tests substitute instrumented ones.
    protocols: ClassVar[dict[bool, type[Protocol]]] = {
        True: ScriptedProtocol,
        False: PlainProtocol,
    }

    def __init__(
        self,
        client: LockClient,
        name: str,
        timeout: float = 30.0,
        *,
        auto_renew: bool = False,
        scripting: bool = True,
        fallback_poll: float = 1.0,
        token: str | None = None,
        claim: str | None = None,
        holder_info: str | dict[str, Any] | None = None,
        limit: int = 1,
        group: str | None = None,
        replicas: int = 0,
        replicas_timeout: float = 0.5,
        fair_after: float | None = None,
        stack: Stack | None = None,
    ) -> None:
        self._fair_ms = fair_ms(fair_after, scripting=scripting)
        self._lease_ms = check_lock(
            name,
            timeout,
            scripting=scripting,
            fallback_poll=fallback_poll,
            token=token,
            claim=claim,
            limit=limit,
            group=group,
        )
        if isinstance(replicas, bool) or not isinstance(replicas, int) or not 0 <= replicas < 2**63:
            raise ValueError(f"replicas must be an integer >= 0, got {replicas!r}")
        self._replicas_timeout_ms = lease_ms(replicas_timeout, "replicas_timeout")
        self.client = client
        self.name = name
        self.timeout = float(timeout)
        self.auto_renew = auto_renew
        self.scripting = scripting
        self.fallback_poll = float(fallback_poll)
        self._cap: float | None = None
        self.claim = claim or ""
        self.limit = limit
        self.group = group or ""
        self.replicas = replicas
        self.replicas_timeout = float(replicas_timeout)
        self.fair_after = fair_after
        if stack is not None:
            if not scripting:
                raise ValueError("stack needs scripting=True (its shares are taken by a script)")
            stack.check_lock(name)
        self.stack = stack
        #: The stacked limit that held back this instance's last failed try (its key was
        #: free), None when the key itself was held or there is no stack.
        self.held_back_by: str | None = None
        self.signal_key = companion_key(name, SIGNAL)
        self._fixed_token = token
        self._given_info = holder_info
        self._mutex = threading.Lock()  # guards _holds (the renewer thread reads holds too)
        _instances.add(self)
        self._start_process()

    def _start_process(self) -> None:
        """Per-process state: set up at construction and again in a forked child, which
        holds nothing its parent held."""
        self._pid = os.getpid()
        self._holds: dict[threading.Thread, Hold] = {}
        # A thread whose last acquire failed while other threads held this instance: the
        # holds it contended with, which it never speaks for.
        self._contended: weakref.WeakKeyDictionary[threading.Thread, tuple[Hold, ...]] = (
            weakref.WeakKeyDictionary()
        )
        self._reservation = threading.Lock()  # threads of one fixed-token owner take turns
        self.holder_info = holder_text(self._given_info, self._pid)
        self.protocol = self.protocols[self.scripting](
            self.client,
            self.name,
            self.signal_key,
            self.holder_info,
            limit=self.limit,
            group=self.group,
            fair_ms=self._fair_ms,
            stack=self.stack,
        )

    def __repr__(self) -> str:
        token = self.token
        shown = f"{token[:8]}…" if token else None
        return f"<RedisLock {self.name!r} token={shown} fence={self.fencing_token}>"

    # -- the hold this call is about ---------------------------------------------------------

    def _own_hold(self) -> Hold | None:
        """The calling thread's hold in this process (forgetting a parent's after fork)."""
        with self._mutex:
            if self._pid != os.getpid():
                self._start_process()
            return self._holds.get(threading.current_thread())

    def _hold(self) -> Hold | None:
        """The calling thread's hold; else the only hold of this instance in this process,
        unless the calling thread contended with that very hold (its acquire failed)."""
        with self._mutex:
            if self._pid != os.getpid():
                self._start_process()
            me = threading.current_thread()
            return hold_for(
                self._holds.get(me),
                self._holds.values(),
                self._contended.get(me, ()),
                lambda hold: hold.thread.is_alive(),
            )

    def _end(self, hold: Hold, *, keep_turn: bool = False) -> None:
        """Forget ``hold`` locally: renewal stops and, unless ``keep_turn``, a waiting thread
        may take its turn."""
        with self._mutex:
            hold.ended = True
            if self._holds.get(hold.thread) is hold:
                del self._holds[hold.thread]
        if not keep_turn:
            self._end_turn(hold)

    def _end_turn(self, hold: Hold) -> None:
        """Let the next thread of a fixed-token owner take its turn."""
        if hold.reserved:
            hold.reserved = False
            self._reservation.release()

    # -- public API ---------------------------------------------------------------------

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Take the lock; wait up to ``timeout`` seconds (None or ``math.inf``: forever; a
        finite wait is at most ``MAX_DURATION``, 365 days) when ``blocking``.

        Returns False only when the lock stayed held; Redis errors raise LockBackendError.
        The calling thread must not hold this instance already (LockError).
        """
        timeout = wait_for(timeout)
        if self._own_hold() is not None:
            raise LockError("this thread already holds it (RedisLock is not re-entrant)", self.name)
        deadline = None if timeout is None else time.monotonic() + timeout
        reserved = False
        if self._fixed_token is not None:
            # One owner token, several threads: the server cannot tell them apart.
            wait = -1 if deadline is None else max(0.0, deadline - time.monotonic())
            if not self._reservation.acquire(blocking, wait if blocking else -1):
                return False
            reserved = True
        try:
            hold = self._acquire(blocking, deadline)
            if hold is not None and self.replicas:
                self._replicate_or_undo(hold.token, hold.key)
        except BaseException:
            if reserved:
                self._reservation.release()
            raise
        if hold is None:
            if reserved:
                self._reservation.release()
            if self._fixed_token is None:  # a fixed token is one owner, whichever thread
                with self._mutex:
                    self._contended[threading.current_thread()] = tuple(self._holds.values())
            return False
        hold.reserved = reserved
        with self._mutex:
            self._holds[hold.thread] = hold
            self._contended.pop(hold.thread, None)
        if self.auto_renew:
            self._start_renewal(hold)
        return True

    def _acquire(self, blocking: bool, deadline: float | None) -> Hold | None:
        token = self._fixed_token or self.group + secrets.token_hex(16)
        me = threading.current_thread()
        cap = self._poll_cap()
        poll_ms = max(1, round(cap * 1000))
        queued = False
        while True:
            started = time.monotonic()
            mode = acquire_mode(queued, blocking)
            limit = None
            try:
                acquired, number, key, limit = self.protocol.acquire(
                    token, self._lease_ms, mode, self.claim, poll_ms
                )
            except LockBackendError as exc:
                number, key = self._held_after_lost_reply(exc, token, queued=blocking)
                acquired = True
            self.held_back_by = limit
            if acquired:
                return Hold(token, number, me, started + self._lease_ms / 1000, key or self.name)
            step = next_step(
                number,
                blocking=blocking,
                deadline=deadline,
                now=time.monotonic(),
                poll_ms=poll_ms,
                cap=cap,
            )
            if step.next is Next.GIVE_UP:
                return None
            queued = True
            if step.next is Next.CANCEL:
                granted = self.protocol.cancel(token)
                if granted is None:
                    return None
                return self._granted(token, granted, me, started)
            # Block until a release hands us the lock or wakes us, the holder's lease ends
            # (its crash is noticed then), or the fallback period passes. A grant comes
            # after the try that queued us, so ``started`` bounds its lease from below.
            try:
                granted = None
                if step.pop is not None:
                    granted = self.protocol.wait(token, step.pop, limit)
                elif step.sleep > 0:
                    time.sleep(step.sleep)  # the last stretch before a lease ends, exactly
            except BaseException:
                self._stop_waiting(token)
                raise
            if granted is not None:
                return self._granted(token, granted, me, started)

    def _granted(self, token: str, grant: Grant, me: threading.Thread, started: float) -> Hold:
        return Hold(token, grant.fence, me, started + self._lease_ms / 1000, grant.key or self.name)

    def _stop_waiting(self, token: str) -> None:
        """Leave the queue after an error or interrupt while waiting; a grant that arrived
        meanwhile is given back."""
        try:
            granted = self.protocol.cancel(token)
            if granted is not None:
                self.protocol.release(token, key=granted.key)
        except LockError as exc:
            log.warning("lock %r: could not leave the waiters' queue: %s", self.name, exc)

    def release(self, *, record: tuple[str, str, int] | None = None) -> None:
        """Release the lock; LockNotOwned if this instance no longer holds it.

        ``record`` = (done set, task id, keep ms) also records that task id as finished in
        the lock's done set (``keyspace.DONE``, pruned to ``keep ms``) in the same atomic
        step.
        """
        hold = self._hold()
        key = None
        if hold is not None:
            # The next thread of a fixed-token owner waits until the server has released:
            # it presents the same token, so a release still in flight would delete its hold.
            self._end(hold, keep_turn=True)
            token, key = hold.token, hold.key
        elif self._fixed_token is not None:
            token = self._fixed_token  # this instance speaks for that owner
            key = self._slot_of(token)
        else:
            raise LockNotOwned("cannot release a lock this instance does not hold", self.name)
        try:
            released = self.protocol.release(token, record, key)
        finally:
            if hold is not None:
                self._end_turn(hold)
        if not released:
            raise LockNotOwned("cannot release a lock that is no longer owned", self.name)

    def extend(self, timeout: float | None = None) -> None:
        """Set the lease end to server now + ``timeout`` (default: the lease); owner only."""
        lease = self._lease_ms if timeout is None else lease_ms(timeout, "timeout")
        hold = self._hold()
        if hold is None and self._fixed_token is None:
            raise LockNotOwned("cannot extend a lock this instance does not hold", self.name)
        started = time.monotonic()
        key: str | None
        if hold is not None:
            token, key = hold.token, hold.key
        else:
            token = cast("str", self._fixed_token)
            key = self._slot_of(token)
        if not self.protocol.extend(token, lease, key):
            raise LockNotOwned("cannot extend a lock that is no longer owned", self.name)
        if self.replicas:
            self._replicate()
        if hold is not None and not hold.ended:
            hold.expires_at = started + lease / 1000
        self._renewed()

    @property
    def lease_lost(self) -> bool:
        """True once the hold can no longer be trusted: renewal found the lock gone, or the
        lease's deadline passed with no confirmed renewal. Judged by the local clock from
        the last confirmed lease, so a stalled connection cannot delay it."""
        hold = self._hold()
        return hold is not None and hold.lost_by(time.monotonic())

    def ensure_held(self) -> None:
        """Raise ``LockLost`` when the calling thread's hold can no longer be trusted (see
        ``lease_lost``), ``LockNotOwned`` when it holds nothing; a check that costs no round
        trip, for long work to call between steps."""
        ensure_held(self._hold(), self.name)

    def owned(self) -> bool:
        """Whether this instance holds the lock right now, per the server's clock."""
        token = self.token
        if token is None:
            return False
        hold = self._hold()
        now_ms, value, _ = self._inspect(hold.key if hold is not None else self._slot_of(token))
        return owns(value, token, now_ms)

    def locked(self) -> bool:
        """Whether anyone holds the lock (any of its slots) right now, per the server's
        clock."""
        return bool(self.holders())

    def holder(self) -> Holder | None:
        """Who holds the lock now (token, fencing token, lease left, holder info), or None;
        with several slots, the newest holder (the largest fencing token)."""
        if self.limit == 1:
            return holder_at(*self._inspect())
        return newest(self.holders())

    def holders(self) -> list[Holder]:
        """Everyone holding the lock now, one per slot held (at most ``limit``).

        With slots, the slot index names the slots held (slot 1, the lock key, is always
        looked at too) and each is judged by its value: three round trips, whose cost grows
        with the holders, not with ``limit``."""
        if self.limit == 1:
            holder = self.holder()
            return [holder] if holder is not None else []
        return holders_at(*self._held_slots())

    def slot_key(self, number: int) -> str:
        """The key of slot ``number`` (1 .. ``limit``): the lock key, or ``<base>slot:<i>``."""
        return slot_key(self.name, number)

    def slot_keys(self) -> list[str]:
        """The keys of this lock's slots: the lock key, then ``<base>slot:<i>`` (names only:
        ``limit`` of them; nothing is read)."""
        return [self.slot_key(i) for i in range(1, self.limit + 1)]

    def _held_slots(self) -> tuple[int, list[tuple[str, LockValue | None, int]]]:
        """Server now (ms), and the key, parsed value and PTTL of slot 1 and of every slot
        the slot index says is held at that moment (``engine/scripts/lib/slots.lua``)."""
        now_ms = self.protocol.server_time()[0]
        members = call(
            self.name,
            self.client.zrangebyscore,
            companion_key(self.name, SLOTS),
            f"({now_ms}",
            "+inf",
        )
        numbers = slot_numbers(cast("list[bytes | str]", members), self.limit)
        keys = [self.slot_key(number) for number in numbers]
        pipe = cast("Any", self.client).pipeline(transaction=False)  # untyped on a cluster
        for key in keys:
            pipe.get(key)
            pipe.pttl(key)
        replies = call(self.name, pipe.execute)
        values = []
        for index, key in enumerate(keys):
            raw, ttl = replies[2 * index], replies[2 * index + 1]
            values.append((key, value_of(raw), int(ttl)))
        return now_ms, values

    def _slot_of(self, token: str) -> str | None:
        """The slot held under ``token`` (a fixed-token instance acting for an owner): the
        one the slot index's owners name, checked against its value; else (an index lost
        or wrong) the one among the slots held whose value has that token."""
        if self.limit == 1:
            return None
        raw = call(self.name, self.client.hget, companion_key(self.name, OWNERS), token)
        number = slot_number(raw) if raw is not None else None
        if number is not None:
            key = self.slot_key(number)
            value = value_of(call(self.name, self.client.get, key))
            if value is not None and value.token == token:
                return key
        return slot_held_by(self._held_slots()[1], token)

    def detach(self) -> None:
        """Stop renewing and forget the hold locally, without releasing it: the lock stays
        with whoever has its owner token (e.g. a queued task message) until it expires."""
        hold = self._hold()
        if hold is not None:
            self._end(hold)

    def __enter__(self) -> RedisLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.release()
        except LockNotOwned:
            if exc is None:
                raise
            log.warning("lock %r was lost before the block that held it failed", self.name)

    # -- internals ------------------------------------------------------------------------

    def _replicate(self) -> None:
        """Wait until ``replicas`` replicas acknowledge every write the server made so far;
        LockBackendError when fewer do within ``replicas_timeout``."""
        acked = call(
            self.name,
            wait_for_replicas,
            self.client,
            self.name,
            companion_key(self.name, SYNC),
            self.replicas,
            self._replicas_timeout_ms,
        )
        if acked < self.replicas:
            raise LockBackendError(
                f"only {acked} of {self.replicas} replicas acknowledged the lock within "
                f"{self.replicas_timeout:g} s",
                self.name,
            )

    def _replicate_or_undo(self, token: str, key: str) -> None:
        """After a hold was granted to ``token``: wait for the replicas, or give the hold
        back (owner-checked) and re-raise, so no lock stays granted that a failover could
        lose."""
        try:
            self._replicate()
        except LockBackendError:
            try:
                self.protocol.release(token, key=key)
            except LockError as exc:  # the server will end the lease
                log.warning("lock %r: could not undo an unreplicated acquire: %s", self.name, exc)
            raise

    def _held_after_lost_reply(
        self, error: LockBackendError, token: str, *, queued: bool
    ) -> tuple[int, str | None]:
        """After an acquire whose reply was lost (a connection error mid-call), look once,
        by token, whether the write happened: return the hold's fencing token if it did,
        so the caller owns what the server granted; re-raise ``error`` if it did not (or
        the server cannot say), leaving nothing held in our name that we do not know of
        but for a lease the server will end."""
        if not reply_lost(error):
            raise error
        try:
            key = self._slot_of(token)
            now_ms, value, _ = self._inspect(key)
        except LockBackendError:
            raise error from error.__cause__
        if value is None or not owns(value, token, now_ms):
            granted = self._cancel_quietly(token) if queued else None
            if granted is None:
                raise error
            return granted.fence, granted.key
        log.warning("lock %r: acquire reply lost, but the server granted it", self.name)
        return value.fence or 0, key

    def _cancel_quietly(self, token: str) -> Grant | None:
        """Leave the waiters' queue if that try put us there; the fencing token if the lock
        was handed to us meanwhile, None otherwise (or when the server cannot say)."""
        try:
            return self.protocol.cancel(token)
        except LockError:
            return None

    def _poll_cap(self) -> float:
        """The longest single block (``rules.poll_cap``: the fallback poll, never near the
        client's socket timeout), worked out once per instance."""
        if self._cap is None:
            self._cap = poll_cap(self.fallback_poll, socket_timeout(self.client))
        return self._cap

    def _inspect(self, key: str | None = None) -> tuple[int, LockValue | None, int | None]:
        """Server time, the parsed value of ``key`` (default: the lock key) and its PTTL (one
        round trip off a cluster)."""
        key = key or self.name
        if isinstance(self.client, RedisCluster):
            # Cluster pipelines refuse keyless commands: read the key's node clock first.
            now_ms = self.protocol.server_time()[0]
            cluster_pipe = cast("Any", self.client).pipeline(transaction=False)  # untyped
            cluster_pipe.get(key)
            cluster_pipe.pttl(key)
            raw, ttl = call(self.name, cluster_pipe.execute)
        else:
            pipe = self.client.pipeline(transaction=False)
            pipe.time()
            pipe.get(key)
            pipe.pttl(key)
            reply, raw, ttl = call(self.name, pipe.execute)
            now_ms = time_reply(reply)[0]
        return now_ms, value_of(raw), int(ttl)
