"""The two engines are one lock: ``RedisLock`` and ``AsyncRedisLock``, built with the same
arguments on one real redis-server, run the same scenario (acquire free and held, a
blocking wait then the hand-off, release and extend by the owner and by others, a takeover
after a lease ran out, stacked limits, slots, a fixed token and a claim, replicas that do
not answer, values they must not overwrite) and leave the same transcript: the same
answers, the same refusals and errors (type and message), the same values written (owner,
waiters' flag, holder info, lease) and the same order of fencing tokens.

The asyncio engine runs on an event loop of its own thread, so one scenario function,
written once, drives both engines through the same blocking calls.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import redis
import redis.asyncio

from celery_singleton_lock import RedisLock
from celery_singleton_lock.aio import AsyncRedisLock
from celery_singleton_lock.engine.stack import Limit, Stack, stack_base
from celery_singleton_lock.engine.value import parse_value
from celery_singleton_lock.testing import RedisServer

WAIT = 60.0  # the bound of every wait for a condition: only a broken lock reaches it


class Side:
    """One engine behind blocking calls: ``make`` a lock, ``call`` a method (awaited on the
    engine's own loop when it is a coroutine), ``start`` one without waiting for it."""

    kind = ""

    def make(self, name: str, **kwargs: Any) -> Any:
        raise NotImplementedError

    def start(self, lock: Any, method: str, *args: Any, **kwargs: Any) -> Future[Any]:
        raise NotImplementedError

    def call(self, lock: Any, method: str, *args: Any, **kwargs: Any) -> Any:
        return self.start(lock, method, *args, **kwargs).result(WAIT)

    def close(self) -> None:
        raise NotImplementedError


class SyncSide(Side):
    kind = "sync"

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url, socket_timeout=30)
        self.pool = ThreadPoolExecutor(4)

    def make(self, name: str, **kwargs: Any) -> RedisLock:
        return RedisLock(self.client, name, **kwargs)

    def start(self, lock: Any, method: str, *args: Any, **kwargs: Any) -> Future[Any]:
        return self.pool.submit(getattr(lock, method), *args, **kwargs)

    def call(self, lock: Any, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(lock, method)(*args, **kwargs)  # in this thread, as a user would

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.client.close()


class AsyncSide(Side):
    kind = "async"

    def __init__(self, url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.client = redis.asyncio.Redis.from_url(url, socket_timeout=30)

    def make(self, name: str, **kwargs: Any) -> AsyncRedisLock:
        return AsyncRedisLock(self.client, name, **kwargs)

    def start(self, lock: Any, method: str, *args: Any, **kwargs: Any) -> Future[Any]:
        async def go() -> Any:
            result = getattr(lock, method)(*args, **kwargs)
            return await result if inspect.isawaitable(result) else result

        return asyncio.run_coroutine_threadsafe(go(), self.loop)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.client.aclose(), self.loop).result(WAIT)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(WAIT)
        self.loop.close()


class Transcript:
    """What a scenario saw, with what differs between two runs for no fault of the lock
    (key names, owner tokens, fencing tokens' absolute values) replaced by stable names."""

    def __init__(self, server: redis.Redis, base: str) -> None:
        self.server = server
        self.base = base
        self.lines: list[tuple[str, Any]] = []
        self.tokens: dict[str, str] = {}
        self.fences: list[int] = []

    def name(self, text: str) -> str:
        return text.replace(self.base, "<base>")

    def token(self, token: str | None) -> str | None:
        if token is None:
            return None
        return self.tokens.setdefault(token, f"owner{len(self.tokens) + 1}")

    def fence(self, fence: int | None) -> int | None:
        """A fencing token as its rank among those seen so far (1 = the first)."""
        if fence is None:
            return None
        if fence not in self.fences:
            self.fences.append(fence)
        assert self.fences == sorted(self.fences), "fencing tokens went backwards"
        return self.fences.index(fence) + 1

    def add(self, label: str, value: Any) -> Any:
        self.lines.append((label, value))
        return value

    def outcome(self, label: str, thunk: Callable[[], Any]) -> Any:
        """Record what ``thunk`` returned, or the error it raised (type and message)."""
        try:
            result = thunk()
        except Exception as exc:
            self.add(label, ("raised", type(exc).__name__, self.name(str(exc))))
            return exc
        self.add(label, ("returned", result))
        return result

    def value(self, label: str, key: str, *, fresh: bool = False) -> None:
        """The value at ``key``: its owner, waiters' flag, holder info and fencing rank;
        with ``fresh`` (just acquired), its lease as written (expiry - fence time)."""
        raw = self.server.get(key)
        if raw is None:
            self.add(label, None)
            return
        value = parse_value(raw)
        seen: dict[str, Any] = {
            "owner": self.token(value.token),
            "fence": self.fence(value.fence),
            "waiters": value.waiters,
            "info": value.info,
        }
        if fresh and value.expiry_ms is not None and value.fence is not None:
            seen["lease_ms"] = value.expiry_ms - value.fence // 1000
        self.add(label, seen)


def until(predicate: Callable[[], Any]) -> None:
    """Wait (bounded) until ``predicate`` holds."""
    event = threading.Event()
    for _ in range(int(WAIT / 0.01)):
        if predicate():
            return
        event.wait(0.01)
    raise AssertionError("condition not reached")


def scenario(side: Side, server: redis.Redis, base: str) -> Transcript:
    """Every step of the comparison, written once for both engines."""
    seen = Transcript(server, base)
    key = f"{base}:plain"
    info = {"who": "parity"}
    first = side.make(key, timeout=30, holder_info=info)
    other = side.make(key, timeout=30, holder_info=info, fallback_poll=30.0)

    # Acquire free, then held (non-blocking and with a short wait).
    seen.outcome("acquire free", lambda: side.call(first, "acquire", blocking=False))
    seen.value("value after acquire", key, fresh=True)
    seen.add("fencing_token", seen.fence(first.fencing_token))
    seen.add("token", seen.token(first.token))
    seen.outcome("acquire held", lambda: side.call(other, "acquire", blocking=False))
    seen.add("held_back_by", other.held_back_by)
    seen.outcome("acquire held, wait 0.3", lambda: side.call(other, "acquire", timeout=0.3))
    seen.add("queue after a timed-out wait", server.zcard(first.protocol.queue_key))
    seen.value("value unchanged", key)
    seen.outcome("owned by holder", lambda: side.call(first, "owned"))
    seen.outcome("owned by other", lambda: side.call(other, "owned"))
    holder = side.call(first, "holder")
    seen.add("holder", (seen.token(holder.token), seen.fence(holder.fence), holder.info))

    # Release and extend by a non-owner, extend by the owner.
    seen.outcome("release by non-owner", lambda: side.call(other, "release"))
    seen.outcome("extend by non-owner", lambda: side.call(other, "extend"))
    seen.outcome("extend by owner", lambda: side.call(first, "extend", 60))
    now, raw = server.pipeline().time().get(key).execute()
    left = parse_value(raw).expiry_ms - (int(now[0]) * 1000 + int(now[1]) // 1000)
    seen.add("extended lease is 60 s (within 10 s)", 50_000 < left <= 60_000)
    seen.value("value after extend", key)

    # A blocking wait, then the hand-off on release.
    waiting = side.start(other, "acquire", timeout=WAIT)
    until(lambda: server.zcard(first.protocol.queue_key) == 1)
    seen.value("value with a waiter", key)
    seen.outcome("release by owner", lambda: side.call(first, "release"))
    seen.add("waiter got it", waiting.result(WAIT))
    seen.value("value after hand-off", key)
    seen.add("waiter's fencing_token", seen.fence(other.fencing_token))
    seen.outcome("release by former owner", lambda: side.call(first, "release"))
    seen.outcome("release by waiter", lambda: side.call(other, "release"))
    seen.add("key after release", server.exists(key))
    seen.outcome("locked", lambda: side.call(first, "locked"))

    # A takeover once a lease ran out (no release).
    short = side.make(f"{base}:short", timeout=0.3)
    taker = side.make(f"{base}:short", timeout=30, fallback_poll=0.1)
    seen.outcome("short lease", lambda: side.call(short, "acquire", blocking=False))
    seen.outcome("takeover", lambda: side.call(taker, "acquire", timeout=WAIT))
    seen.add("taker's fence is later", seen.fence(taker.fencing_token))
    seen.value("value after takeover", f"{base}:short", fresh=True)
    seen.outcome("late release", lambda: side.call(short, "release"))
    seen.outcome("late extend", lambda: side.call(short, "extend"))
    seen.outcome("late owned", lambda: side.call(short, "owned"))
    seen.outcome("taker releases", lambda: side.call(taker, "release"))

    # Stacked limits: a second hold finds the limit full, then room.
    stack = Stack(stack_base(base), (Limit("global", "global", 1),))
    one = side.make(f"{base}:job:1:{{{base}:stack}}", stack=stack, timeout=30)
    two = side.make(f"{base}:job:2:{{{base}:stack}}", stack=stack, timeout=30)
    seen.outcome("stack: first", lambda: side.call(one, "acquire", blocking=False))
    seen.outcome("stack: second", lambda: side.call(two, "acquire", blocking=False))
    seen.add("stack: held back by", two.held_back_by)
    shares = server.zrange(stack_base(base) + "limit:global", 0, -1)
    seen.add("stack: shares", [s.decode().split(":")[0] for s in shares])  # type: ignore[union-attr]
    waiting = side.start(two, "acquire", timeout=WAIT)
    until(lambda: server.zcard(stack_base(base) + "line:global") == 1)
    seen.outcome("stack: first releases", lambda: side.call(one, "release"))
    seen.add("stack: second got room", waiting.result(WAIT))
    seen.outcome("stack: second releases", lambda: side.call(two, "release"))
    seen.add("stack: shares left", server.zcard(stack_base(base) + "limit:global"))

    # Slots: at most ``limit`` holders; a fixed token speaks for its owner; a claim.
    slots = [side.make(f"{base}:slots", limit=2, timeout=30) for _ in range(3)]
    for index, lock in enumerate(slots):
        seen.outcome(f"slot {index}", lambda lock=lock: side.call(lock, "acquire", blocking=False))
    seen.add("slot keys", sorted(seen.name(lock.held_key) for lock in slots[:2]))
    seen.add("holders", len(side.call(slots[2], "holders")))
    for lock in slots[:2]:
        seen.outcome("slot release", lambda lock=lock: side.call(lock, "release"))
    owner = side.make(f"{base}:fixed", token="queued-message", timeout=30)
    seen.outcome("fixed token", lambda: side.call(owner, "acquire", blocking=False))
    fence = seen.fence(owner.fencing_token)
    claimer = side.make(f"{base}:fixed", claim="queued-message", timeout=30)
    seen.outcome("claim", lambda: side.call(claimer, "acquire", blocking=False))
    seen.add("claim keeps the fencing token", seen.fence(claimer.fencing_token) == fence)
    seen.outcome("released by the claimer", lambda: side.call(claimer, "release"))
    speaker = side.make(f"{base}:fixed", token="queued-message", timeout=30)
    seen.outcome("fixed token, no hold", lambda: side.call(speaker, "release"))

    # Replicas that never acknowledge: the acquire is undone and raises.
    replicated = side.make(f"{base}:replicas", replicas=1, replicas_timeout=0.05)
    seen.outcome("replicas", lambda: side.call(replicated, "acquire", blocking=False))
    seen.add("undone", server.exists(f"{base}:replicas"))

    # Values that are not ours to overwrite, and a key of the wrong type.
    server.set(f"{base}:foreign", "hello: world")
    foreign = side.make(f"{base}:foreign")
    seen.outcome("foreign value", lambda: side.call(foreign, "acquire", blocking=False))
    seen.outcome("foreign value, locked", lambda: side.call(foreign, "locked"))
    server.rpush(f"{base}:list", "x")
    listed = side.make(f"{base}:list")
    seen.outcome("wrong type", lambda: side.call(listed, "acquire", blocking=False))
    return seen


def test_both_engines_leave_the_same_transcript(
    redis_server: RedisServer, client: redis.Redis
) -> None:
    """The scenario, run once per engine on keys of its own: the transcripts are equal line
    by line, and they say what the lock must do."""
    transcripts = {}
    for make_side in (SyncSide, AsyncSide):
        side = make_side(redis_server.url)
        try:
            base = f"par{uuid.uuid4().hex[:8]}"
            transcripts[side.kind] = scenario(side, client, base).lines
        finally:
            side.close()
    sync, aio = transcripts["sync"], transcripts["async"]
    assert [label for label, _ in sync] == [label for label, _ in aio]
    for (label, mine), (_, theirs) in zip(sync, aio, strict=True):
        assert mine == theirs, (label, mine, theirs)
    said = dict(sync)
    assert said["acquire free"] == ("returned", True)
    assert said["value after acquire"]["lease_ms"] == 30_000
    assert said["acquire held"] == ("returned", False)
    assert said["release by non-owner"][:2] == ("raised", "LockNotOwned")
    assert said["waiter got it"] is True
    assert said["waiter's fencing_token"] == 2
    assert said["takeover"] == ("returned", True)
    assert said["late release"][:2] == ("raised", "LockNotOwned")
    assert said["stack: second"] == ("returned", False)
    assert said["stack: held back by"] == "global"
    assert said["stack: second got room"] is True
    assert said["slot 2"] == ("returned", False)
    assert said["claim keeps the fencing token"] is True
    assert said["replicas"][:2] == ("raised", "LockBackendError")
    assert said["undone"] == 0
    assert said["foreign value"][:2] == ("raised", "LockBackendError")
    assert said["wrong type"][:2] == ("raised", "LockBackendError")
