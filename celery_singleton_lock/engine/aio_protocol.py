"""The asyncio side of the wire: bounded, error-mapped calls on a ``redis.asyncio`` client,
EVALSHA of the registered scripts, and the scripted protocol that ``AsyncRedisLock`` runs.

Nothing of the protocol is written twice: which script an operation runs, its keys and
arguments and what its reply means come from :class:`.scripted.ScriptCalls`; the keys of
the waiters' queue from :class:`.protocol.LockKeys`; what a waiter's BLPOP or a cancelled
wait brought from :mod:`.protocol`; the scripts themselves from :data:`.scripts.SCRIPTS`;
redis-py errors become ``LockBackendError`` through :func:`.wire.backend_error`. Only the
calls are awaited here.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable
from typing import Any, TypeVar, cast

import redis
import redis.asyncio
from redis.exceptions import RedisClusterException

from celery_singleton_lock.engine.protocol import (
    Attempt,
    Grant,
    LockKeys,
    cancel_commands,
    cancelled,
    granted_to,
    popped_grant,
    read_commands,
)
from celery_singleton_lock.engine.scripted import ScriptCall, ScriptCalls
from celery_singleton_lock.engine.wire import backend_error, time_reply
from celery_singleton_lock.exceptions import LockBackendError

__all__ = ["DEFAULT_CALL_TIMEOUT", "AsyncScriptedProtocol", "acall", "evalsha"]

#: Seconds a call may take when the client sets no ``socket_timeout`` of its own (the
#: default the sync client factory gives the Celery side's clients): a stalled Redis ends
#: a call with ``LockBackendError``, never hangs a coroutine. A BLPOP gets its block time
#: on top.
DEFAULT_CALL_TIMEOUT = 5.0

_T = TypeVar("_T")


async def _within(awaitable: Awaitable[_T], seconds: float) -> _T:
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(seconds):
            return await awaitable
    return await asyncio.wait_for(awaitable, seconds)  # pragma: no cover - Python 3.10


async def acall(name: str, bound: float | None, awaitable: Awaitable[_T]) -> _T:
    """Await one Redis call for lock ``name``, at most ``bound`` seconds (None: the
    client's own socket timeout governs), turning redis-py errors into LockBackendError
    as the sync ``wire.call`` does. Running out of ``bound`` is a ``redis.TimeoutError``
    (the cause), as a socket timeout would be: the reply, not the call, may be lost."""
    try:
        if bound is None:
            return await awaitable
        return await _within(awaitable, bound)
    except LockBackendError:
        raise
    except asyncio.TimeoutError as exc:  # our bound ran out (never a redis-py error)
        lost = redis.TimeoutError(f"Redis did not answer within {bound:g} s")
        lost.__cause__ = exc
        raise backend_error(lost, name) from lost
    except (redis.RedisError, RedisClusterException) as exc:
        raise backend_error(exc, name) from exc


async def evalsha(client: redis.asyncio.Redis, sent: ScriptCall) -> Any:
    """Run a registered script by its SHA1, loading it on NOSCRIPT (first use, or a
    restarted or failed-over server); EVAL is never sent."""
    execute: Any = client.execute_command
    try:
        return await execute("EVALSHA", sent.script.sha, sent.numkeys, *sent.args)
    except redis.exceptions.NoScriptError:
        await client.script_load(sent.script.source)
        return await execute("EVALSHA", sent.script.sha, sent.numkeys, *sent.args)


class AsyncScriptedProtocol(LockKeys):
    """Acquire, release and extend as one EVALSHA each, the waiters' BLPOP and cancel,
    and the server clock, awaited on a ``redis.asyncio`` client; every call bounded by
    ``bound`` seconds (None: by the client's socket timeout)."""

    def __init__(
        self, client: redis.asyncio.Redis, *args: Any, bound: float | None = None, **kwargs: Any
    ) -> None:
        """``client``, then the arguments of :class:`.protocol.LockKeys`."""
        super().__init__(*args, **kwargs)
        self.client = client
        self.bound = bound
        self.calls = ScriptCalls(self)
        self._redis: Any = client  # redis-py types async commands as "Awaitable | Any"

    async def call(self, awaitable: Awaitable[_T], *, blocks: float = 0.0) -> _T:
        """One bounded, error-mapped call; ``blocks``: the seconds it blocks on purpose."""
        return await acall(
            self.name, None if self.bound is None else self.bound + blocks, awaitable
        )

    async def _run(self, sent: ScriptCall) -> Any:
        return await self.call(evalsha(self.client, sent))

    async def acquire(
        self, token: str, lease_ms: int, mode: bytes, claim: str = "", poll_ms: int = 1000
    ) -> Attempt:
        """One try (see ``Protocol.acquire``)."""
        return self.calls.attempt(
            await self._run(self.calls.acquire(token, lease_ms, mode, claim, poll_ms))
        )

    async def release(
        self, token: str, record: tuple[str, str, int] | None = None, key: str | None = None
    ) -> int:
        """Owner-checked release (see ``Protocol.release``)."""
        return int(await self._run(self.calls.release(token, record, key)))

    async def extend(self, token: str, lease_ms: int, key: str | None = None) -> int:
        """Owner-checked new lease end (see ``Protocol.extend``)."""
        return int(await self._run(self.calls.extend(token, lease_ms, key)))

    async def wait(self, token: str, seconds: float, limit: str | None = None) -> Grant | None:
        """Block up to ``seconds`` until a release wakes this waiter (see
        ``Protocol.wait``)."""
        keys = self.wake_keys(token, limit)
        reply = await self.call(self._redis.blpop(keys, timeout=seconds), blocks=seconds)
        return popped_grant(reply, keys[0])

    async def cancel(self, token: str) -> Grant | None:
        """A waiter stops waiting (see ``Protocol.cancel``)."""
        pipe = self._redis.pipeline(transaction=False)
        cancel_commands(pipe, self, token)
        handed = cancelled(await self.call(pipe.execute()))
        if handed is None:
            return None
        raw = await self.call(self._redis.get(handed.key or self.name))
        return granted_to(handed, raw, token)

    async def server_time(self) -> tuple[int, int]:
        """The server's clock as (milliseconds, microseconds)."""
        return time_reply(await self.call(self._redis.time()))

    # -- reads (and the replicas' WAIT) that the lock's flows ask for (``core``) -----------

    async def inspect(self, key: str) -> tuple[int, Any, Any]:
        """Server time (ms), the raw value of ``key`` and its PTTL, in one round trip."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.time()
        now, raw, ttl = await self.call(read_commands(pipe, [key]).execute())
        return time_reply(now)[0], raw, ttl

    async def slot_index(self, now_ms: int) -> Any:
        """The slots the slot index says are held after server time ``now_ms``."""
        return await self.call(self._redis.zrangebyscore(self.slots_key, f"({now_ms}", "+inf"))

    async def read_slots(self, keys: list[str]) -> list[Any]:
        """The raw value and PTTL of each of ``keys``, flat."""
        pipe = read_commands(self._redis.pipeline(transaction=False), keys)
        return cast("list[Any]", await self.call(pipe.execute()))

    async def owner_slot(self, token: str) -> Any:
        """The slot number the slot index's owners give ``token`` (raw), or None."""
        return await self.call(self._redis.hget(self.owners_key, token))

    async def get(self, key: str) -> Any:
        """The raw value of ``key``."""
        return await self.call(self._redis.get(key))

    async def replicate(self, replicas: int, timeout_ms: int) -> int:
        """How many replicas acknowledged every write so far: a marker written, then
        ``WAIT``, on one connection (see ``wire.wait_for_replicas``)."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.set(self.sync_key, b"1", px=timeout_ms + 1000)
        pipe.execute_command("WAIT", replicas, timeout_ms)
        _, acked = await self.call(pipe.execute(), blocks=timeout_ms / 1000)
        return int(acked)
