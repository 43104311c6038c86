"""``AsyncRedisLock``: ``RedisLock`` for asyncio, on a ``redis.asyncio`` client.

The same lock on the wire: the same Lua scripts (:data:`.scripts.SCRIPTS`, sent by
EVALSHA), the same value grammar, companion keys, fencing tokens, waiters' queue and direct
hand-off, so an ``AsyncRedisLock`` and a ``RedisLock`` (or a classic SETNX locker) on one
key exclude each other. It is the sync engine's own lock: the arguments, the hold a call
is about and every step of acquire, wait, release, extend, renewal and the reads are
:class:`.steps.LockSteps`'s flows, which this module runs by awaiting each call they ask for
(:func:`.flow.arun`) on :class:`.aio_protocol.AsyncScriptedProtocol`. Only what asyncio
changes is written here: the caller is a task, the turn of a fixed token's tasks is an
``asyncio.Lock``, a renewal is a task, and a clean-up survives repeated cancellation.

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
import contextlib
import logging
import time
import weakref
from types import TracebackType
from typing import Any

import redis
import redis.asyncio

from celery_singleton_lock.engine.aio_protocol import DEFAULT_CALL_TIMEOUT, AsyncScriptedProtocol
from celery_singleton_lock.engine.flow import arun
from celery_singleton_lock.engine.holds import Hold
from celery_singleton_lock.engine.renewal import RENEW_DIVISOR
from celery_singleton_lock.engine.steps import LockSteps
from celery_singleton_lock.engine.value import Holder
from celery_singleton_lock.engine.wire import socket_timeout
from celery_singleton_lock.exceptions import LockNotOwned

__all__ = ["DEFAULT_CALL_TIMEOUT", "AsyncRedisLock"]

log = logging.getLogger("celery_singleton_lock.engine.aio")

_Task = asyncio.Task[Any]


def _current_task() -> _Task | None:
    """The asyncio task running this call; None outside a running event loop."""
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None


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
        delay = await arun(lock, lock._renewal(hold))
        del lock


class AsyncRedisLock(LockSteps[redis.asyncio.Redis]):
    """A lease-based distributed lock on one Redis key, for asyncio: ``RedisLock``'s API
    with ``await`` (``acquire``, ``release``, ``extend``, ``owned``, ``locked``,
    ``holder``, ``holders``) and ``async with``.

    ``client`` is a ``redis.asyncio.Redis`` (a single server, or a Sentinel master from
    ``redis.asyncio.sentinel``). Every call is bounded: by the client's ``socket_timeout``
    when it has one, else by ``DEFAULT_CALL_TIMEOUT`` (5 s; a waiter's BLPOP gets its block
    time on top), so a stalled Redis raises ``LockBackendError`` instead of hanging.

    Every other argument means what it means for ``RedisLock`` (``timeout``, the lease;
    ``auto_renew``, ``fallback_poll``, ``token``, ``claim``, ``holder_info``, ``limit``,
    ``group``, ``replicas``, ``replicas_timeout``, ``fair_after``, ``stack`` and
    ``unless_finished``): the steps
    of acquire, wait, release, extend and renewal are the sync engine's own
    (:class:`~.steps.LockSteps`), awaited here; a Redis Cluster client is not taken.

    A hold belongs to the asyncio task that acquired it: ``release()``, ``extend()``,
    ``owned()``, ``fencing_token`` and ``lease_lost`` act on the calling task's hold, or,
    from a task that holds none, on the one hold this instance has (a lock taken in one
    task and released in another) — except in a task whose acquire failed against that
    very hold while its task still runs. A cancelled ``acquire()`` leaves the waiters'
    queue and gives back a lock handed to it meanwhile, to the end however often it is
    cancelled, before the cancellation reaches its caller.

    ``scripting=False`` raises ``ValueError``: the plain-command protocol is a WATCH /
    MULTI conversation whose decisions sit between its round trips, and it exists only in
    the sync engine (use ``RedisLock(..., scripting=False)`` in a thread where EVAL is
    disabled). That, and a cluster client, is all it does not do.
    """

    _kind = "AsyncRedisLock"
    _caller = "task"
    _recovers_cut_replies = True  # a cancellation may cut off the reply that granted it
    _log = log
    _mutex = contextlib.nullcontext()  # one thread: nothing to guard
    protocol: AsyncScriptedProtocol

    def _setup(self) -> None:
        # The client's own read timeout governs when it has one; else every call gets ours.
        timed = socket_timeout(self.client) is not None  # type: ignore[arg-type]
        self._bound = None if timed else DEFAULT_CALL_TIMEOUT

    def _check_engine(self, client: Any, scripting: bool) -> None:
        if not scripting:
            raise ValueError(
                "AsyncRedisLock runs the lock's scripts only: scripting=False (plain "
                "commands under WATCH) exists in the sync engine alone; use "
                "RedisLock(..., scripting=False) where EVAL is disabled"
            )
        if isinstance(client, redis.asyncio.RedisCluster) or not isinstance(
            client, redis.asyncio.Redis
        ):
            raise TypeError(
                "AsyncRedisLock needs a redis.asyncio.Redis client (use RedisLock for a sync "
                f"client; Redis Cluster is not supported in asyncio yet), got {client!r}"
            )

    def _start_process(self) -> None:
        self._renewals: dict[Hold, asyncio.Task[None]] = {}
        self._reservation = asyncio.Lock()  # tasks of one fixed-token owner take turns
        super()._start_process()

    def _wire(self, *args: Any, **kwargs: Any) -> AsyncScriptedProtocol:
        return AsyncScriptedProtocol(self.client, *args, bound=self._bound, **kwargs)

    def _me(self) -> _Task | None:
        return _current_task()

    def _holder_alive(self, hold: Hold) -> bool:
        return any(not task.done() for task, held in self._holds.items() if held is hold)  # type: ignore[attr-defined]

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

    _sleep = staticmethod(asyncio.sleep)

    def _start_renewal(self, hold: Hold) -> None:
        """Renew ``hold`` a third of a lease from now, and on, until it ends."""
        self._renewals[hold] = asyncio.get_running_loop().create_task(
            _renewing(weakref.ref(self), hold, self.timeout / RENEW_DIVISOR),
            name=f"csl-renew {self.name}",
        )

    def _stop_renewal(self, hold: Hold) -> None:
        renewal = self._renewals.pop(hold, None)
        if renewal is not None:
            renewal.cancel()  # an extend in flight is shielded: it ends on its own

    # -- public API ---------------------------------------------------------------------

    async def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Take the lock; wait up to ``timeout`` seconds (None or ``math.inf``: forever)
        when ``blocking``. False only when the lock stayed held; Redis errors raise
        LockBackendError. The calling task must not hold this instance already
        (LockError). Cancelling the calling task leaves the waiters' queue and gives back
        whatever the server granted meanwhile, however often it is cancelled."""
        return await arun(self, self._acquire(blocking, timeout))

    async def release(self, *, record: tuple[str, str, int] | None = None) -> None:
        """Release the lock; LockNotOwned if this instance no longer holds it (see
        ``RedisLock.release`` for ``record``)."""
        await arun(self, self._release(record))

    async def extend(self, timeout: float | None = None) -> None:
        """Set the lease end to server now + ``timeout`` (default: the lease); owner only."""
        await arun(self, self._extend(timeout))

    async def owned(self) -> bool:
        """Whether this instance holds the lock right now, per the server's clock."""
        return await arun(self, self._owned())

    async def locked(self) -> bool:
        """Whether anyone holds the lock (any of its slots) right now, per the server's
        clock."""
        return bool(await arun(self, self._holders()))

    async def holder(self) -> Holder | None:
        """Who holds the lock now, or None; with several slots, the newest holder."""
        return await arun(self, self._holder())

    async def holders(self) -> list[Holder]:
        """Everyone holding the lock now, one per slot held (at most ``limit``)."""
        return await arun(self, self._holders())

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
