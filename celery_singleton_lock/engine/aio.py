"""``AsyncRedisLock``: ``RedisLock`` for asyncio, on a ``redis.asyncio`` client.

The same lock on the wire: the same Lua scripts (:data:`.scripts.SCRIPTS`, sent by
EVALSHA), the same value grammar, companion keys, fencing tokens, waiters' queue and direct
hand-off, so an ``AsyncRedisLock`` and a ``RedisLock`` (or a classic SETNX locker) on one
key exclude each other. Everything that is not a call to Redis is the sync engine's own
code: argument checks, the waiting arithmetic, which hold a call is about
(:mod:`.rules`), the script calls and their replies (:class:`.scripted.ScriptCalls`), the
waiters' keys and replies (:mod:`.protocol`), the lease bookkeeping (:class:`.holds.Hold`)
and the judgement of a renewal's reply (:class:`.renewal.Renewing`). Only the control
flow around the awaited calls is written here.

Ownership belongs to one hold, and a hold to the asyncio *task* that acquired it (as a
``RedisLock`` hold belongs to a thread): another task calling ``acquire()`` on the same
instance contends like any client; the holding task re-acquiring gets ``LockError``.

Renewal (``auto_renew=True``) is an asyncio task per hold, started with the hold and
ended with it; ``lease_lost`` is judged by the clock, so a stalled server cannot delay it.
Scripted mode only: ``scripting=False`` is refused (see the class docstring). Imports
nothing from Celery.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import uuid
import weakref
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, cast

import redis
import redis.asyncio

from celery_singleton_lock.engine.aio_protocol import DEFAULT_CALL_TIMEOUT, AsyncScriptedProtocol
from celery_singleton_lock.engine.holds import Hold, HoldView
from celery_singleton_lock.engine.keyspace import OWNERS, SIGNAL, SLOTS, companion_key
from celery_singleton_lock.engine.protocol import Attempt, Grant
from celery_singleton_lock.engine.renewal import RENEW_DIVISOR, Renewing
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
from celery_singleton_lock.engine.value import Holder, LockValue
from celery_singleton_lock.engine.wire import socket_timeout, time_reply
from celery_singleton_lock.exceptions import LockBackendError, LockError, LockNotOwned

__all__ = ["DEFAULT_CALL_TIMEOUT", "AsyncRedisLock"]

log = logging.getLogger("celery_singleton_lock.engine.aio")

_Task = asyncio.Task[Any]


def _current_task() -> _Task | None:
    """The asyncio task running this call; None outside a running event loop."""
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None


async def _to_the_end(cleanup: Coroutine[Any, Any, None]) -> None:
    """Run ``cleanup`` to its end, however often the calling task is cancelled meanwhile
    (anyio and Starlette cancel scopes cancel again and again, nested timeouts each once),
    then raise the cancellation if there was one. A bare ``asyncio.shield`` gives up at
    the second cancellation, leaving the clean-up to finish in the background, or never,
    when the event loop ends first: a grant it was giving back would stay held by nobody
    for the whole lease."""
    task = asyncio.ensure_future(cleanup)
    cancelled: asyncio.CancelledError | None = None
    while True:
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError as exc:
            if task.done():  # the clean-up itself was cancelled (the loop is closing)
                raise
            cancelled = exc
            continue
        break
    if cancelled is not None:
        raise cancelled


class _Judge(Renewing):
    """What a renewal's reply means for a hold, judged by the sync engine's own
    ``Renewing._renewal_reply`` (the lease's new local deadline, lost for good, or retried
    sooner after an error), for a lock renewed by an asyncio task."""

    def __init__(self, name: str, timeout: float, lease: int) -> None:
        self.name = name
        self.timeout = timeout
        self._lease_ms = lease

    def judge(self, hold: Hold, started: float, reply: int | BaseException) -> float | None:
        """Record the reply to a renewal sent at ``started``; the delay until the next
        one, or None to stop."""
        return self._renewal_reply(hold, started, reply)


async def _renewing(ref: weakref.ref[AsyncRedisLock], hold: Hold, delay: float | None) -> None:
    """The renewal task of ``hold``: extend its lease every third of a lease until it
    ends, is lost, or its lock is garbage-collected (only a weak reference is kept, as the
    sync renewer lanes do: a lock dropped without release stops being renewed and
    expires)."""
    while delay is not None:
        await asyncio.sleep(delay)
        lock = ref()
        if lock is None:
            return
        delay = await lock._renew(hold)
        del lock


class AsyncRedisLock(HoldView):
    """A lease-based distributed lock on one Redis key, for asyncio: ``RedisLock``'s API
    with ``await`` (``acquire``, ``release``, ``extend``, ``owned``, ``locked``,
    ``holder``, ``holders``) and ``async with``.

    ``client`` is a ``redis.asyncio.Redis`` (a single server, or a Sentinel master from
    ``redis.asyncio.sentinel``). Every call is bounded: by the client's ``socket_timeout``
    when it has one, else by ``DEFAULT_CALL_TIMEOUT`` (5 s; a waiter's BLPOP gets its block
    time on top), so a stalled Redis raises ``LockBackendError`` instead of hanging.

    ``timeout`` (the lease), ``auto_renew``, ``fallback_poll``, ``token``, ``claim``,
    ``holder_info``, ``limit`` and ``group`` mean what they mean for ``RedisLock``. A hold
    belongs to the asyncio task that acquired it: ``release()``, ``extend()``,
    ``owned()``, ``fencing_token`` and ``lease_lost`` act on the calling task's hold, or,
    from a task that holds none, on the one hold this instance has (a lock taken in one
    task and released in another) — except in a task whose acquire failed against that
    very hold while its task still runs.

    ``scripting=False`` raises ``ValueError``: the plain-command protocol is a WATCH /
    MULTI conversation whose decisions sit between its round trips, and it exists only in
    the sync engine (use ``RedisLock(..., scripting=False)`` in a thread where EVAL is
    disabled). ``replicas`` is not offered either.
    """

    def __init__(
        self,
        client: redis.asyncio.Redis,
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
        fair_after: float | None = None,
    ) -> None:
        if not scripting:
            raise ValueError(
                "AsyncRedisLock runs the lock's scripts only: scripting=False (plain "
                "commands under WATCH) exists in the sync engine alone; use "
                "RedisLock(..., scripting=False) where EVAL is disabled"
            )
        self._lease_ms = check_lock(
            name,
            timeout,
            scripting=True,
            fallback_poll=fallback_poll,
            token=token,
            claim=claim,
            limit=limit,
            group=group,
        )
        self._fair_ms = fair_ms(fair_after, scripting=True)
        self.fair_after = fair_after
        if isinstance(client, redis.asyncio.RedisCluster) or not isinstance(
            client, redis.asyncio.Redis
        ):
            raise TypeError(
                "AsyncRedisLock needs a redis.asyncio.Redis client (use RedisLock for a sync "
                f"client; Redis Cluster is not supported in asyncio yet), got {client!r}"
            )
        self.client = client
        self.name = name
        self.timeout = float(timeout)
        self.auto_renew = auto_renew
        self.scripting = True
        self.fallback_poll = float(fallback_poll)
        self.claim = claim or ""
        self.limit = limit
        self.group = group or ""
        self.signal_key = companion_key(name, SIGNAL)
        self._fixed_token = token
        self._given_info = holder_info
        # The client's own read timeout governs when it has one; else every call gets ours.
        self._socket_timeout = socket_timeout(cast("Any", client))
        self._bound = None if self._socket_timeout is not None else DEFAULT_CALL_TIMEOUT
        self._judge = _Judge(name, self.timeout, self._lease_ms)
        self._start_process()

    def _start_process(self) -> None:
        """Per-process state: set up at construction and again in a forked child, which
        holds nothing its parent held."""
        self._pid = os.getpid()
        self._holds: dict[_Task, Hold] = {}
        # A task whose last acquire failed while other tasks held this instance: the holds
        # it contended with, which it never speaks for.
        self._contended: weakref.WeakKeyDictionary[_Task, tuple[Hold, ...]] = (
            weakref.WeakKeyDictionary()
        )
        self._renewals: dict[Hold, asyncio.Task[None]] = {}
        self._reservation = asyncio.Lock()  # tasks of one fixed-token owner take turns
        self.holder_info = holder_text(self._given_info, self._pid)
        self.protocol = AsyncScriptedProtocol(
            self.client,
            self.name,
            self.signal_key,
            self.holder_info,
            limit=self.limit,
            group=self.group,
            fair_ms=self._fair_ms,
            bound=self._bound,
        )

    def __repr__(self) -> str:
        token = self.token
        shown = f"{token[:8]}…" if token else None
        return f"<AsyncRedisLock {self.name!r} token={shown} fence={self.fencing_token}>"

    # -- the hold this call is about ---------------------------------------------------------

    def _forked(self) -> None:
        if self._pid != os.getpid():
            self._start_process()

    def _own_hold(self, me: _Task | None) -> Hold | None:
        """The calling task's hold in this process."""
        self._forked()
        return self._holds.get(me) if me is not None else None

    def _hold(self) -> Hold | None:
        """The calling task's hold; else the only hold of this instance in this process,
        unless the calling task contended with that very hold (``rules.hold_for``)."""
        self._forked()
        me = _current_task()
        return hold_for(
            self._holds.get(me) if me is not None else None,
            self._holds.values(),
            self._contended.get(me, ()) if me is not None else (),
            self._holder_alive,
        )

    def _holder_alive(self, hold: Hold) -> bool:
        return any(not task.done() for task, held in self._holds.items() if held is hold)

    def _end(self, hold: Hold, *, keep_turn: bool = False) -> None:
        """Forget ``hold`` locally: its renewal task ends and, unless ``keep_turn``, a
        waiting task of a fixed-token owner may take its turn."""
        hold.ended = True
        for task, held in list(self._holds.items()):
            if held is hold:
                del self._holds[task]
        renewal = self._renewals.pop(hold, None)
        if renewal is not None:
            renewal.cancel()  # an extend in flight is shielded: it ends on its own
        if not keep_turn:
            self._end_turn(hold)

    def _end_turn(self, hold: Hold) -> None:
        """Let the next task of a fixed-token owner take its turn."""
        if hold.reserved:
            hold.reserved = False
            self._reservation.release()

    @property
    def lease_lost(self) -> bool:
        """True once the hold can no longer be trusted: renewal found the lock gone, or the
        lease's deadline passed with no confirmed renewal (judged by the local clock, so a
        stalled connection cannot delay it)."""
        hold = self._hold()
        return hold is not None and hold.lost_by(time.monotonic())

    def ensure_held(self) -> None:
        """Raise ``LockLost`` when the calling task's hold can no longer be trusted (see
        ``lease_lost``), ``LockNotOwned`` when it holds nothing; a check that costs no round
        trip, for long work to call between steps."""
        ensure_held(self._hold(), self.name)

    # -- public API ---------------------------------------------------------------------

    async def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Take the lock; wait up to ``timeout`` seconds (None or ``math.inf``: forever)
        when ``blocking``. False only when the lock stayed held; Redis errors raise
        LockBackendError. The calling task must not hold this instance already
        (LockError). Cancelling the calling task leaves the waiters' queue and gives back
        whatever the server granted meanwhile."""
        wait = wait_for(timeout)
        me = _current_task()
        if me is None:
            raise LockError("AsyncRedisLock.acquire() must run in an asyncio task", self.name)
        if self._own_hold(me) is not None:
            raise LockError(
                "this task already holds it (AsyncRedisLock is not re-entrant)", self.name
            )
        deadline = None if wait is None else time.monotonic() + wait
        reserved = False
        if self._fixed_token is not None:
            # One owner token, several tasks: the server cannot tell them apart.
            if not await self._reserve(blocking, deadline):
                return False
            reserved = True
        try:
            hold = await self._acquire(blocking, deadline)
        except BaseException:
            if reserved:
                self._reservation.release()
            raise
        if hold is None:
            if reserved:
                self._reservation.release()
            if self._fixed_token is None:  # a fixed token is one owner, whichever task
                self._contended[me] = tuple(self._holds.values())
            return False
        hold.reserved = reserved
        self._holds[me] = hold
        self._contended.pop(me, None)
        if self.auto_renew:
            self._start_renewal(hold)
        return True

    async def _reserve(self, blocking: bool, deadline: float | None) -> bool:
        """The local turn of a fixed-token owner's tasks."""
        if not blocking:
            if self._reservation.locked():
                return False
            await self._reservation.acquire()  # free: taken without suspending
            return True
        if deadline is None:
            await self._reservation.acquire()
            return True
        try:
            await asyncio.wait_for(
                self._reservation.acquire(), max(0.0, deadline - time.monotonic())
            )
        except asyncio.TimeoutError:
            return False
        return True

    async def _acquire(self, blocking: bool, deadline: float | None) -> Hold | None:
        token = self._fixed_token or self.group + uuid.uuid4().hex
        cap = poll_cap(self.fallback_poll, self._socket_timeout)
        poll_ms = max(1, round(cap * 1000))
        queued = False
        while True:
            started = time.monotonic()
            mode = acquire_mode(queued, blocking)
            try:
                attempt = await self.protocol.acquire(
                    token, self._lease_ms, mode, self.claim, poll_ms
                )
            except LockBackendError as exc:
                number, key = await self._held_after_lost_reply(exc, token, queued=blocking)
                attempt = Attempt(True, number, key)
            except BaseException:
                # Cancelled (or interrupted) with the try on its way: the server may have
                # queued us or granted the lock. Leave nothing held in our name.
                await _to_the_end(self._stop_waiting(token))
                raise
            if attempt.acquired:
                return self._hold_of(token, attempt.number, attempt.key, started)
            step = next_step(
                attempt.number,
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
                granted = await self.protocol.cancel(token)
                if granted is None:
                    return None
                return self._hold_of(token, granted.fence, granted.key, started)
            # Block until a release hands us the lock or wakes us, the holder's lease ends
            # (its crash is noticed then), or the fallback period passes. A grant comes
            # after the try that queued us, so ``started`` bounds its lease from below.
            try:
                granted = None
                if step.pop is not None:
                    granted = await self.protocol.wait(token, step.pop)
                elif step.sleep > 0:
                    await asyncio.sleep(step.sleep)  # the last stretch before a lease ends
            except BaseException:
                await _to_the_end(self._stop_waiting(token))
                raise
            if granted is not None:
                return self._hold_of(token, granted.fence, granted.key, started)

    def _hold_of(self, token: str, fence: int, key: str | None, started: float) -> Hold:
        return Hold(
            token,
            fence,
            threading.current_thread(),
            started + self._lease_ms / 1000,
            key or self.name,
        )

    async def _stop_waiting(self, token: str) -> None:
        """Leave the queue after an error, a cancellation or an interrupt while trying or
        waiting; a grant that arrived meanwhile is given back. In asyncio a cancellation is
        routine, and it may cut off the reply that carried a grant (or the try that
        acquired): so a lock still held under this attempt's own token is given back too
        (owner-checked; never under a fixed ``token``, which other holders share)."""
        try:
            granted = await self.protocol.cancel(token)
            if granted is not None:
                await self.protocol.release(token, key=granted.key)
            elif self._fixed_token is None:
                key = self.name if self.limit == 1 else await self._slot_of(token)
                if key is not None:
                    await self.protocol.release(token, key=key)
        except LockError as exc:
            log.warning("lock %r: could not leave the waiters' queue: %s", self.name, exc)

    async def release(self, *, record: tuple[str, str, int] | None = None) -> None:
        """Release the lock; LockNotOwned if this instance no longer holds it (see
        ``RedisLock.release`` for ``record``)."""
        hold = self._hold()
        key = None
        if hold is not None:
            # The next task of a fixed-token owner waits until the server has released: it
            # presents the same token, so a release still in flight would delete its hold.
            self._end(hold, keep_turn=True)
            token, key = hold.token, hold.key
        elif self._fixed_token is not None:
            token = self._fixed_token  # this instance speaks for that owner
            key = await self._slot_of(token)
        else:
            raise LockNotOwned("cannot release a lock this instance does not hold", self.name)
        try:
            released = await self.protocol.release(token, record, key)
        finally:
            if hold is not None:
                self._end_turn(hold)
        if not released:
            raise LockNotOwned("cannot release a lock that is no longer owned", self.name)

    async def extend(self, timeout: float | None = None) -> None:
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
            key = await self._slot_of(token)
        if not await self.protocol.extend(token, lease, key):
            raise LockNotOwned("cannot extend a lock that is no longer owned", self.name)
        if hold is not None and not hold.ended:
            hold.expires_at = started + lease / 1000

    async def owned(self) -> bool:
        """Whether this instance holds the lock right now, per the server's clock."""
        token = self.token
        if token is None:
            return False
        hold = self._hold()
        now_ms, value, _ = await self._inspect(
            hold.key if hold is not None else await self._slot_of(token)
        )
        return owns(value, token, now_ms)

    async def locked(self) -> bool:
        """Whether anyone holds the lock (any of its slots) right now, per the server's
        clock."""
        return bool(await self.holders())

    async def holder(self) -> Holder | None:
        """Who holds the lock now, or None; with several slots, the newest holder."""
        if self.limit == 1:
            return holder_at(*await self._inspect())
        return newest(await self.holders())

    async def holders(self) -> list[Holder]:
        """Everyone holding the lock now, one per slot held (at most ``limit``)."""
        if self.limit == 1:
            holder = await self.holder()
            return [holder] if holder is not None else []
        return holders_at(*await self._held_slots())

    def slot_key(self, number: int) -> str:
        """The key of slot ``number`` (1 .. ``limit``): the lock key, or ``<base>slot:<i>``."""
        return slot_key(self.name, number)

    def slot_keys(self) -> list[str]:
        """The keys of this lock's slots (names only: nothing is read)."""
        return [self.slot_key(i) for i in range(1, self.limit + 1)]

    def detach(self) -> None:
        """Stop renewing and forget the hold locally, without releasing it."""
        hold = self._hold()
        if hold is not None:
            self._end(hold)

    async def __aenter__(self) -> AsyncRedisLock:
        await self.acquire()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self.release()
        except LockNotOwned:
            if exc is None:
                raise
            log.warning("lock %r was lost before the block that held it failed", self.name)

    # -- renewal --------------------------------------------------------------------------

    def _start_renewal(self, hold: Hold) -> None:
        """Renew ``hold`` a third of a lease from now, and on, until it ends."""
        self._renewals[hold] = asyncio.get_running_loop().create_task(
            _renewing(weakref.ref(self), hold, self.timeout / RENEW_DIVISOR),
            name=f"csl-renew {self.name}",
        )

    async def _renew(self, hold: Hold) -> float | None:
        """Extend ``hold``'s lease; the delay until its next renewal, or None to stop. The
        extend is shielded: ending the hold cancels the renewal task, never a call half
        sent on a connection."""
        if hold.ended or not self.auto_renew:
            return None
        started = time.monotonic()
        reply: int | BaseException
        try:
            reply = await asyncio.shield(self.protocol.extend(hold.token, self._lease_ms, hold.key))
        except Exception as exc:  # noqa: BLE001 - a LockError, or a client closed under us
            reply = exc
        return self._judge.judge(hold, started, reply)

    # -- reading the server -----------------------------------------------------------------

    async def _held_after_lost_reply(
        self, error: LockBackendError, token: str, *, queued: bool
    ) -> tuple[int, str | None]:
        """After an acquire whose reply was lost, look once, by token, whether the write
        happened (see ``RedisLock._held_after_lost_reply``)."""
        if not reply_lost(error):
            raise error
        try:
            key = await self._slot_of(token)
            now_ms, value, _ = await self._inspect(key)
        except LockBackendError:
            raise error from error.__cause__
        if value is None or not owns(value, token, now_ms):
            granted = await self._cancel_quietly(token) if queued else None
            if granted is None:
                raise error
            return granted.fence, granted.key
        log.warning("lock %r: acquire reply lost, but the server granted it", self.name)
        return value.fence or 0, key

    async def _cancel_quietly(self, token: str) -> Grant | None:
        try:
            return await self.protocol.cancel(token)
        except LockError:
            return None

    async def _inspect(self, key: str | None = None) -> tuple[int, LockValue | None, int | None]:
        """Server time, the parsed value of ``key`` (default: the lock key) and its PTTL,
        in one round trip."""
        pipe: Any = self.client.pipeline(transaction=False)
        pipe.time()
        pipe.get(key or self.name)
        pipe.pttl(key or self.name)
        now, raw, ttl = await self.protocol.call(pipe.execute())
        return time_reply(now)[0], value_of(raw), int(ttl)

    async def _held_slots(self) -> tuple[int, list[tuple[str, LockValue | None, int]]]:
        """Server now (ms), and the key, parsed value and PTTL of slot 1 and of every slot
        the slot index says is held at that moment."""
        now_ms = (await self.protocol.server_time())[0]
        members = await self.protocol.call(
            cast("Any", self.client).zrangebyscore(
                companion_key(self.name, SLOTS), f"({now_ms}", "+inf"
            )
        )
        keys = [self.slot_key(number) for number in slot_numbers(members, self.limit)]
        pipe: Any = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.get(key)
            pipe.pttl(key)
        replies = await self.protocol.call(pipe.execute())
        return now_ms, [
            (key, value_of(replies[2 * i]), int(replies[2 * i + 1])) for i, key in enumerate(keys)
        ]

    async def _slot_of(self, token: str) -> str | None:
        """The slot held under ``token`` (see ``RedisLock._slot_of``); None without
        slots."""
        if self.limit == 1:
            return None
        client: Any = self.client
        raw = await self.protocol.call(client.hget(companion_key(self.name, OWNERS), token))
        number = slot_number(raw) if raw is not None else None
        if number is not None:
            key = self.slot_key(number)
            value = value_of(await self.protocol.call(client.get(key)))
            if value is not None and value.token == token:
                return key
        return slot_held_by((await self._held_slots())[1], token)
