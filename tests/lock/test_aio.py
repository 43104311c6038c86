"""``AsyncRedisLock`` meets the engine's contract: the scenarios of the sync suite (exclusion,
hand-off, fencing, owner-only release, leases, renewal, planted values, slots, claim,
errors), run against the asyncio engine on a real redis-server, and both engines on one key
exclude each other, hand over to each other and share one sequence of fencing tokens.

pytest-asyncio is not used: each test drives its coroutine with ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import multiprocessing
import os
import random
import signal
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import redis
import redis.asyncio

from celery_singleton_lock import LockBackendError, LockError, LockNotOwned, RedisLock
from celery_singleton_lock.aio import AsyncRedisLock
from celery_singleton_lock.engine import aio as aio_engine
from celery_singleton_lock.engine.keyspace import companion_key
from celery_singleton_lock.engine.value import parse_value
from celery_singleton_lock.testing import RedisServer, free_port

Scenario = Callable[[redis.asyncio.Redis], Awaitable[None]]


@asynccontextmanager
async def connected(url: str, **kwargs: Any) -> AsyncIterator[redis.asyncio.Redis]:
    """An asyncio client of ``url``, closed on the way out."""
    kwargs.setdefault("socket_connect_timeout", 10)  # a loaded host is slow to schedule it
    client = redis.asyncio.Redis.from_url(url, **kwargs)
    try:
        yield client
    finally:
        await client.aclose()


def run(url: str, scenario: Scenario, **kwargs: Any) -> None:
    """Run ``scenario(client)`` in a fresh event loop with a client of ``url``."""

    async def main() -> None:
        async with connected(url, **kwargs) as client:
            await scenario(client)

    asyncio.run(main())


async def eventually(predicate: Callable[[], Any], timeout: float) -> bool:
    """Poll ``predicate`` every 20 ms (without blocking the loop) until it holds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def _increasing(values: list[int]) -> bool:
    return all(a < b for a, b in itertools.pairwise(values))


def _flag(client: redis.Redis, key: str) -> bytes:
    """The waiters' flag of the lock value at ``key``."""
    raw = client.get(key)
    assert isinstance(raw, bytes)
    return raw.split(b":")[1]


def _count_calls(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(row["calls"]) for name, row in stats.items()}


# -- exclusion --------------------------------------------------------------------------------


def test_tasks_and_threads_of_both_engines_never_overlap(
    redis_server: RedisServer, key: str
) -> None:
    """Twelve asyncio tasks (eight with an AsyncRedisLock each, four sharing one instance)
    and four threads with a sync RedisLock, on one key, each doing 15 non-atomic
    read-increment-writes of a Redis counter under the lock: never two inside at once, no
    lost update, and the fencing tokens strictly increase in the order the sections ran."""
    rounds = 15
    counter = f"{key}:counter"
    guard = threading.Lock()
    state = {"inside": 0, "most": 0}
    fences: list[int] = []
    errors: list[BaseException] = []

    def enter(fence: int | None) -> None:
        with guard:
            state["inside"] += 1
            state["most"] = max(state["most"], state["inside"])
            fences.append(fence or 0)

    def leave() -> None:
        with guard:
            state["inside"] -= 1

    sync_client = redis.Redis.from_url(redis_server.url, socket_timeout=10)

    def sync_worker() -> None:
        try:
            lock = RedisLock(sync_client, key, timeout=10, fallback_poll=0.2)
            for _ in range(rounds):
                assert lock.acquire(timeout=60)
                enter(lock.fencing_token)
                value = int(sync_client.get(counter) or 0)
                time.sleep(0.001)
                sync_client.set(counter, value + 1)
                leave()
                lock.release()
        except BaseException as exc:
            errors.append(exc)

    async def async_worker(client: redis.asyncio.Redis, lock: AsyncRedisLock) -> None:
        for _ in range(rounds):
            assert await lock.acquire(timeout=60)
            enter(lock.fencing_token)
            value = int(await client.get(counter) or 0)
            await asyncio.sleep(0.001)
            await client.set(counter, value + 1)
            leave()
            await lock.release()

    async def scenario(client: redis.asyncio.Redis) -> None:
        shared = AsyncRedisLock(client, key, timeout=10, fallback_poll=0.2)
        locks = [AsyncRedisLock(client, key, timeout=10, fallback_poll=0.2) for _ in range(8)]
        await asyncio.gather(*(async_worker(client, lock) for lock in [*locks, *[shared] * 4]))

    threads = [threading.Thread(target=sync_worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        run(redis_server.url, scenario)
    finally:
        for thread in threads:
            thread.join(60)
    assert not errors, errors
    assert state["most"] == 1
    assert int(sync_client.get(counter) or 0) == 16 * rounds
    assert len(fences) == 16 * rounds
    assert _increasing(fences)
    sync_client.close()


def test_one_instance_shared_by_tasks_is_held_per_task(redis_server: RedisServer, key: str) -> None:
    """A task re-acquiring the instance it holds gets LockError; another task contends like
    any client and, having lost, neither owns, nor sees a fencing token, nor can release or
    extend; a task that holds nothing (and never contended) releases the one hold."""

    async def scenario(client: redis.asyncio.Redis) -> None:
        lock = AsyncRedisLock(client, key, timeout=10)

        async def take() -> None:
            assert await lock.acquire(blocking=False)

        await asyncio.create_task(take())  # held by a task that has ended
        assert lock.fencing_token is not None
        await lock.release()  # by a task that holds nothing: the one hold of the instance
        assert not await lock.locked()

        assert await lock.acquire(blocking=False)
        with pytest.raises(LockError, match="not re-entrant"):
            await lock.acquire(blocking=False)

        async def contender() -> dict[str, Any]:
            report: dict[str, Any] = {
                "acquired": await lock.acquire(timeout=0.2),
                "owned": await lock.owned(),
                "fence": lock.fencing_token,
                "lost": lock.lease_lost,
            }
            for name, call in (("release", lock.release), ("extend", lock.extend)):
                try:
                    await call()
                    report[name] = "done"
                except LockNotOwned:
                    report[name] = "not owned"
            return report

        assert await asyncio.create_task(contender()) == {
            "acquired": False, "owned": False, "fence": None, "lost": False,
            "release": "not owned", "extend": "not owned",
        }  # fmt: skip
        assert await lock.owned()
        await lock.release()
        assert not await lock.locked()

    run(redis_server.url, scenario)


# -- waiting and hand-off ---------------------------------------------------------------------


async def _queued(client: redis.Redis, key: str, count: int) -> None:
    """Return once ``count`` waiters have their place in ``key``'s queue (bounded: 30 s),
    instead of sleeping and hoping they have."""
    deadline = time.monotonic() + 30
    while client.zcard(companion_key(key, "queue")) < count:
        assert time.monotonic() < deadline, f"fewer than {count} waiters queued"
        await asyncio.sleep(0.01)


def test_waiters_of_both_engines_get_the_lock_in_the_order_they_came(
    redis_server: RedisServer, key: str
) -> None:
    """Six waiters, asyncio tasks and sync threads by turns, queue one after another behind
    an async holder: the releases hand the lock over in exactly their arrival order."""
    sync_client = redis.Redis.from_url(redis_server.url, socket_timeout=30)
    order: list[int] = []
    errors: list[BaseException] = []

    def sync_waiter(index: int) -> None:
        try:
            lock = RedisLock(sync_client, key, timeout=30, fallback_poll=5.0)
            assert lock.acquire(timeout=20)
            order.append(index)
            lock.release()
        except BaseException as exc:
            errors.append(exc)

    async def scenario(client: redis.asyncio.Redis) -> None:
        holder = AsyncRedisLock(client, key, timeout=30)
        assert await holder.acquire()

        async def async_waiter(index: int) -> None:
            lock = AsyncRedisLock(client, key, timeout=30, fallback_poll=5.0)
            assert await lock.acquire(timeout=20)
            order.append(index)
            await lock.release()

        tasks: list[asyncio.Task[None]] = []
        threads: list[threading.Thread] = []
        for index in range(6):
            if index % 2:
                thread = threading.Thread(target=sync_waiter, args=(index,))
                thread.start()
                threads.append(thread)
            else:
                tasks.append(asyncio.create_task(async_waiter(index)))
            await _queued(sync_client, key, index + 1)  # queued before the next one comes
        await holder.release()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
        for thread in threads:
            await asyncio.to_thread(thread.join, 30)

    run(redis_server.url, scenario)
    assert not errors, errors
    assert order == [0, 1, 2, 3, 4, 5]
    sync_client.close()


@pytest.mark.parametrize("holder_engine", ["async", "sync"])
def test_the_waiter_owns_the_lock_without_another_try(
    fresh_server: RedisServer, holder_engine: str
) -> None:
    """A release (by either engine) hands the lock to the blocked async waiter: the waiter
    owns it with a larger fencing token and no script ran after the release but the
    release itself."""
    sync_client = redis.Redis.from_url(fresh_server.url)

    async def scenario(client: redis.asyncio.Redis) -> None:
        waiter = AsyncRedisLock(client, "handoff", timeout=30, fallback_poll=10.0)
        if holder_engine == "async":
            holder: Any = AsyncRedisLock(client, "handoff", timeout=30)
            acquire, release = holder.acquire, holder.release
        else:
            holder = RedisLock(sync_client, "handoff", timeout=30)

            async def acquire() -> bool:
                return bool(holder.acquire())

            async def release() -> None:
                holder.release()

        assert await acquire()
        await release()  # the scripts are loaded now: no NOSCRIPT retry below
        assert await acquire()
        first = holder.fencing_token
        waiting = asyncio.create_task(waiter.acquire(timeout=20))
        await _queued(sync_client, "handoff", 1)  # the release will hand the lock to it
        before = _count_calls(sync_client)
        await release()
        assert await asyncio.wait_for(waiting, 10)
        after = _count_calls(sync_client)
        assert await waiter.owned()
        assert waiter.fencing_token is not None
        assert first is not None
        assert waiter.fencing_token > first
        assert after.get("evalsha", 0) - before.get("evalsha", 0) == 1, (before, after)
        await waiter.release()
        assert not await waiter.locked()

    run(fresh_server.url, scenario)
    sync_client.close()


def test_release_wakes_a_waiter_long_before_its_fallback_poll(
    redis_server: RedisServer, key: str
) -> None:
    async def scenario(client: redis.asyncio.Redis) -> None:
        # neither the poll (60 s) nor the holder's lease (120 s) comes within the waiter's
        # 45 s timeout: only the release's wake-up lets it in (no elapsed-time bound)
        holder = AsyncRedisLock(client, key, timeout=120)
        waiter = AsyncRedisLock(client, key, timeout=30, fallback_poll=60.0)
        assert await holder.acquire()
        waiting = asyncio.create_task(waiter.acquire(timeout=45))
        await asyncio.sleep(0.3)
        await holder.release()
        assert await asyncio.wait_for(waiting, 60)
        await waiter.release()

    run(redis_server.url, scenario)


def test_acquire_timeout_is_respected(redis_server: RedisServer, key: str) -> None:
    async def scenario(client: redis.asyncio.Redis) -> None:
        # not sooner than asked; the upper bound only says "not at the 60 s poll", with 15 s
        # spare for a busy machine
        holder = AsyncRedisLock(client, key, timeout=120)
        assert await holder.acquire()
        for wanted in (0.05, 0.4):
            started = time.monotonic()
            lock = AsyncRedisLock(client, key, fallback_poll=60.0)
            assert not await lock.acquire(timeout=wanted)
            assert wanted - 0.01 < time.monotonic() - started < wanted + 15
        await holder.release()

    run(redis_server.url, scenario)


def test_commands_during_a_three_second_wait_stay_bounded(fresh_server: RedisServer) -> None:
    """A waiter blocked 3 s behind a live holder sends a bounded number of commands per
    fallback period (one try and one blocking pop), not a sleep-and-retry loop's."""
    sync_client = redis.Redis.from_url(fresh_server.url)

    def total() -> int:
        stats = sync_client.info("commandstats")
        return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")

    async def scenario(client: redis.asyncio.Redis) -> None:
        holder = AsyncRedisLock(client, "busy", timeout=60)
        waiter = AsyncRedisLock(client, "busy", timeout=60, fallback_poll=1.0)
        assert await holder.acquire()
        before = total()
        started = time.monotonic()
        assert not await waiter.acquire(timeout=3)
        elapsed = time.monotonic() - started
        used = total() - before - 1  # minus our own INFO
        assert elapsed >= 3.0 - 0.01  # a late return is load, not a fault
        # about 25 per fallback period begun, counted over the wait's real length
        assert used <= 25 * (int(elapsed / 1.0) + 1), (used, elapsed)

    run(fresh_server.url, scenario)
    sync_client.close()


def test_non_blocking_try_does_not_ask_for_a_wake_up(
    redis_server: RedisServer, client: redis.Redis, key: str
) -> None:
    async def scenario(aclient: redis.asyncio.Redis) -> None:
        holder = AsyncRedisLock(aclient, key, timeout=30)
        assert await holder.acquire()
        assert not await AsyncRedisLock(aclient, key).acquire(blocking=False)
        assert _flag(client, key) == b"0"
        await holder.release()
        assert client.llen(holder.signal_key) == 0
        assert await holder.acquire()
        assert not await AsyncRedisLock(aclient, key).acquire(timeout=0.2)
        assert _flag(client, key) == b"1"
        await holder.release()

    run(redis_server.url, scenario)


def test_fallback_poll_longer_than_the_socket_timeout(redis_server: RedisServer, key: str) -> None:
    """A waiter whose fallback poll (60 s) is longer than its client's socket timeout (3 s)
    waits its full acquire timeout (4 s) without a LockBackendError, and a release wakes it."""

    async def scenario(client: redis.asyncio.Redis) -> None:
        holder = AsyncRedisLock(client, key, timeout=30)
        waiter = AsyncRedisLock(client, key, timeout=30, fallback_poll=60.0)
        assert await holder.acquire()
        started = time.monotonic()
        assert not await waiter.acquire(timeout=4.0)
        # not sooner; not the 60 s poll (15 s spare for a busy machine)
        assert 4.0 - 0.01 < time.monotonic() - started < 4.0 + 15

        async def release_later() -> None:
            await asyncio.sleep(0.5)
            await holder.release()

        releasing = asyncio.create_task(release_later())
        assert await waiter.acquire(timeout=30)
        await releasing
        await waiter.release()

    # 3 s: a host running two copies of the suite has taken over a second to answer a GET
    run(redis_server.url, scenario, socket_timeout=3.0)


def test_a_cancelled_waiter_leaves_the_queue_and_is_never_handed_the_lock(
    redis_server: RedisServer, client: redis.Redis, key: str
) -> None:
    """A waiter whose task is cancelled (``asyncio.wait_for`` running out) leaves the
    queue: the holder's release frees the lock for whoever comes next instead of handing
    it to the departed waiter."""

    async def scenario(aclient: redis.asyncio.Redis) -> None:
        holder = AsyncRedisLock(aclient, key, timeout=30)
        quitter = AsyncRedisLock(aclient, key, timeout=30, fallback_poll=5.0)
        assert await holder.acquire()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(quitter.acquire(), 0.4)
        assert client.zcard(holder.protocol.queue_key) == 0
        await holder.release()
        assert not await holder.locked()
        newcomer = AsyncRedisLock(aclient, key, timeout=30)
        assert await newcomer.acquire(blocking=False)
        await newcomer.release()

    run(redis_server.url, scenario)


def test_a_waiter_cancelled_as_the_lock_is_handed_to_it_leaves_it_free(
    redis_server: RedisServer, key: str
) -> None:
    """A waiter cancelled just as a release hands it the lock (the grant still on its way,
    or already taken) never leaves the lock held by nobody: either its acquire finished
    (and it releases) or the cancellation gave the lock back."""
    outcomes: set[str] = set()

    async def scenario(client: redis.asyncio.Redis) -> None:
        for index in range(20):
            holder = AsyncRedisLock(client, key, timeout=30)
            waiter = AsyncRedisLock(client, key, timeout=30, fallback_poll=5.0)
            assert await holder.acquire()
            waiting = asyncio.create_task(waiter.acquire(timeout=10))
            await asyncio.sleep(0.1)  # queued and blocked
            if index % 2:
                await holder.release()
            else:
                releasing = asyncio.create_task(holder.release())
                await asyncio.sleep(0)
            waiting.cancel()
            try:
                got = await waiting
            except asyncio.CancelledError:
                got = False
            if index % 2 == 0:
                await releasing
            if got:
                await waiter.release()
            outcomes.add("acquired" if got else "cancelled")
            assert not await holder.locked()

    run(redis_server.url, scenario)
    assert "cancelled" in outcomes


# -- ownership, leases and fencing -------------------------------------------------------------


def test_fencing_tokens_strictly_increase_across_both_engines(
    redis_server: RedisServer, client: redis.Redis, key: str
) -> None:
    """Holds taken by turns by the two engines, by release and by take-over of an expired
    lease in both directions: every fencing token is larger than the one before."""
    tokens: list[int] = []

    async def scenario(aclient: redis.asyncio.Redis) -> None:
        for index in range(6):
            if index % 2:
                sync_lock = RedisLock(client, key, timeout=10)
                assert sync_lock.acquire(blocking=False)
                tokens.append(sync_lock.fencing_token or 0)
                sync_lock.release()
            else:
                async_lock = AsyncRedisLock(aclient, key, timeout=10)
                assert await async_lock.acquire(blocking=False)
                tokens.append(async_lock.fencing_token or 0)
                await async_lock.release()
        stale_async = AsyncRedisLock(aclient, key, timeout=0.2)
        assert await stale_async.acquire(blocking=False)
        tokens.append(stale_async.fencing_token or 0)
        await asyncio.sleep(0.3)
        stealer = RedisLock(client, key, timeout=0.2)
        assert stealer.acquire(blocking=False)  # takes the expired lease over
        tokens.append(stealer.fencing_token or 0)
        await asyncio.sleep(0.3)
        async_stealer = AsyncRedisLock(aclient, key, timeout=10)
        assert await async_stealer.acquire(blocking=False)
        tokens.append(async_stealer.fencing_token or 0)
        with pytest.raises(LockNotOwned):
            await stale_async.release()
        with pytest.raises(LockNotOwned):
            stealer.release()
        assert await async_stealer.owned()
        await async_stealer.release()

    run(redis_server.url, scenario)
    assert len(tokens) == 9
    assert _increasing(tokens)


def test_a_stale_holders_release_and_extend_spare_the_next_holder(
    redis_server: RedisServer, client: redis.Redis, key: str
) -> None:
    """An async holder that outlived its lease gets LockNotOwned from release and extend,
    and the sync holder that took over keeps the lock; the same the other way round; a
    never-acquired instance's release raises and deletes nothing."""

    async def scenario(aclient: redis.asyncio.Redis) -> None:
        late = AsyncRedisLock(aclient, key, timeout=0.3)
        assert await late.acquire()
        await asyncio.sleep(0.35)
        successor = RedisLock(client, key, timeout=10)
        assert successor.acquire(blocking=False)
        with pytest.raises(LockNotOwned):
            await late.release()
        with pytest.raises(LockNotOwned):
            await AsyncRedisLock(aclient, key).release()  # never acquired
        assert successor.owned()
        successor.release()

        sync_late = RedisLock(client, key, timeout=0.3)
        assert sync_late.acquire()
        await asyncio.sleep(0.35)
        async_successor = AsyncRedisLock(aclient, key, timeout=10)
        assert await async_successor.acquire(blocking=False)
        with pytest.raises(LockNotOwned):
            sync_late.release()
        with pytest.raises(LockNotOwned):
            sync_late.extend()
        assert await async_successor.owned()
        late2 = AsyncRedisLock(aclient, key, timeout=0.2)
        await async_successor.release()
        assert await late2.acquire()
        await asyncio.sleep(0.25)
        thief = AsyncRedisLock(aclient, key, timeout=10)
        assert await thief.acquire(blocking=False)
        with pytest.raises(LockNotOwned):
            await late2.extend()
        assert await thief.owned()
        await thief.release()
        assert not await thief.locked()

    run(redis_server.url, scenario)


def test_extend_pushes_the_lease_end_and_the_key_ttl_follows_the_lease(
    redis_server: RedisServer, client: redis.Redis, key: str
) -> None:
    async def scenario(aclient: redis.asyncio.Redis) -> None:
        holder = AsyncRedisLock(aclient, key, timeout=0.4)
        rival = RedisLock(client, key)
        assert await holder.acquire()
        await asyncio.sleep(0.25)
        await holder.extend(5.0)  # 5 s: the next 0.3 s sleep may overrun on a busy machine
        assert client.pttl(key) > 5000
        await asyncio.sleep(0.3)
        assert not rival.acquire(blocking=False)
        assert await holder.owned()
        await holder.release()
        five = AsyncRedisLock(aclient, key, timeout=5)
        assert await five.acquire()
        # the key's TTL ends 1.5 s (the grace) after the lease, whenever this reads it
        pipe = client.pipeline(transaction=True)
        pipe.get(key).time().pttl(key)
        raw, (seconds, micros), ttl = pipe.execute()
        lease_ends = parse_value(raw).expiry_ms
        assert lease_ends is not None
        key_ends = int(seconds) * 1000 + int(micros) // 1000 + ttl
        assert abs(key_ends - (lease_ends + 1500)) <= 2, (key_ends, lease_ends)
        await five.release()

    run(redis_server.url, scenario)


def _hold_in_a_child(url: str, name: str, ready: Any) -> None:
    """Hold the lock (1 s lease, no renewal) from an event loop of its own, until killed."""

    async def hold() -> None:
        async with connected(url) as client:
            lock = AsyncRedisLock(client, name, timeout=1.0)
            assert await lock.acquire()
            # the key stays a minute (its lease still ends in 1 s): a waiter gets in only
            # by taking over the ended lease, never because Redis expired the key
            await client.pexpire(name, 60_000)
            ready.set()
            await asyncio.sleep(60)

    asyncio.run(hold())


def test_a_killed_holder_is_succeeded_within_lease_plus_one_poll(
    redis_server: RedisServer, key: str
) -> None:
    """An async holder in a process killed with SIGKILL is succeeded once its 1 s lease
    runs out (its key kept), within one fallback period: judged on the server's clock,
    after the lease's end and before a poll plus a generous 10 s for a busy machine."""
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    proc = ctx.Process(target=_hold_in_a_child, args=(redis_server.url, key, ready))
    proc.start()
    try:
        assert ready.wait(30)
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGKILL)

        async def scenario(client: redis.asyncio.Redis) -> None:
            dead = parse_value(await client.get(key)).expiry_ms
            assert dead is not None
            waiter = AsyncRedisLock(client, key, timeout=5, fallback_poll=1.0)
            assert await waiter.acquire(timeout=30)
            seconds, micros = await client.time()
            now = int(seconds) * 1000 + int(micros) // 1000
            assert dead <= now < dead + 1000 + 10_000
            assert await waiter.owned()
            await waiter.release()

        run(redis_server.url, scenario)
    finally:
        proc.kill()
        proc.join(timeout=5)


def test_context_manager_releases_on_exit_and_on_error(redis_server: RedisServer, key: str) -> None:
    async def scenario(client: redis.asyncio.Redis) -> None:
        lock = AsyncRedisLock(client, key, timeout=5.0)
        async with lock as held:
            assert held is lock
            assert await held.owned()
        assert not await lock.locked()
        with pytest.raises(RuntimeError, match="boom"):
            async with lock:
                raise RuntimeError("boom")
        assert not await lock.locked()

    run(redis_server.url, scenario)


def test_tasks_of_one_fixed_token_take_turns(redis_server: RedisServer, key: str) -> None:
    """With a fixed owner token the server cannot tell two tasks apart, so the instance
    makes them take turns; an instance with that token releases that owner's hold."""

    async def scenario(client: redis.asyncio.Redis) -> None:
        lock = AsyncRedisLock(client, key, timeout=10, token="shared-owner")
        assert await lock.acquire(blocking=False)

        released: list[str] = []

        async def other() -> dict[str, Any]:
            seen: dict[str, Any] = {"try": await lock.acquire(blocking=False)}
            seen["later"] = await lock.acquire(timeout=30)
            seen["after_release"] = released == ["first"]  # its turn came after the release
            await lock.release()
            return seen

        turn = asyncio.create_task(other())
        await asyncio.sleep(0.4)
        released.append("first")
        await lock.release()
        seen = await asyncio.wait_for(turn, 45)
        assert seen["try"] is False
        assert seen["later"] is True
        assert seen["after_release"] is True

        holder = AsyncRedisLock(client, key, timeout=10, token="owner-7")
        assert await holder.acquire(blocking=False)
        await AsyncRedisLock(client, key, token="owner-7").release()
        assert not await holder.locked()

    run(redis_server.url, scenario)


# -- renewal and lease loss -------------------------------------------------------------------


def test_auto_renew_is_an_asyncio_task_that_holds_past_several_leases(
    redis_server: RedisServer, client: redis.Redis, key: str
) -> None:
    """A 1.5 s lease renewed by an asyncio task (no renewer thread) is held for 4 s while
    rivals of both engines fail (renewed every 0.5 s: only a loop starved for a second
    could lose it); after release the task is gone and nothing recreates the key."""
    before = {t.ident for t in threading.enumerate() if t.name == "csl-lock-renewer"}

    async def scenario(aclient: redis.asyncio.Redis) -> None:
        holder = AsyncRedisLock(aclient, key, timeout=1.5, auto_renew=True)
        async_rival = AsyncRedisLock(aclient, key)
        sync_rival = RedisLock(client, key)
        assert await holder.acquire()
        renewals = [t for t in asyncio.all_tasks() if t.get_name().startswith("csl-renew")]
        assert len(renewals) == 1
        deadline = time.monotonic() + 4.0
        while time.monotonic() < deadline:
            assert not await async_rival.acquire(blocking=False)
            assert not sync_rival.acquire(blocking=False)
            await asyncio.sleep(0.1)
        assert await holder.owned()
        assert not holder.lease_lost
        now = {t.ident for t in threading.enumerate() if t.name == "csl-lock-renewer"}
        assert now <= before  # renewed without a thread
        await holder.release()
        await asyncio.sleep(0.3)  # a renewal after release would recreate the key
        assert renewals[0].done()
        assert not await holder.locked()

    run(redis_server.url, scenario)


def test_auto_renew_reports_a_lost_lease(
    redis_server: RedisServer, client: redis.Redis, key: str
) -> None:
    async def scenario(aclient: redis.asyncio.Redis) -> None:
        holder = AsyncRedisLock(aclient, key, timeout=0.6, auto_renew=True)
        assert await holder.acquire()
        client.delete(key)
        assert await eventually(lambda: holder.lease_lost, 3)
        with pytest.raises(LockNotOwned):
            await holder.release()

    run(redis_server.url, scenario)


def test_lease_lost_without_renewal_once_the_lease_ends(
    redis_server: RedisServer, key: str
) -> None:
    async def scenario(client: redis.asyncio.Redis) -> None:
        lock = AsyncRedisLock(client, key, timeout=0.3)
        assert await lock.acquire(blocking=False)
        assert not lock.lease_lost
        assert await eventually(lambda: lock.lease_lost, 3)
        successor = AsyncRedisLock(client, key, timeout=5)
        assert await successor.acquire(timeout=3)
        await successor.release()

    run(redis_server.url, scenario)


def test_a_stopped_server_does_not_delay_lease_lost_nor_other_servers_renewals(
    fresh_server: RedisServer,
) -> None:
    """SIGSTOP the server under two auto-renewed 1 s leases (one client waits up to 100 s
    per call, the other sets no timeout): lease_lost is True about a lease later, not after
    a socket timeout (the 30 s bound leaves a busy machine plenty); a lock on another server
    (2 s lease) keeps being renewed meanwhile, past its first lease."""
    with RedisServer() as other:

        async def scenario(client: redis.asyncio.Redis) -> None:
            async with connected(fresh_server.url) as bare, connected(other.url) as healthy:
                stalled = AsyncRedisLock(client, "stall:{a}", timeout=1.0, auto_renew=True)
                unbounded = AsyncRedisLock(bare, "stall:{b}", timeout=1.0, auto_renew=True)
                elsewhere = AsyncRedisLock(healthy, "fine:{c}", timeout=2.0, auto_renew=True)
                assert await stalled.acquire(blocking=False)
                assert await unbounded.acquire(blocking=False)
                assert await elsewhere.acquire(blocking=False)
                assert fresh_server.pid is not None
                os.kill(fresh_server.pid, signal.SIGSTOP)
                stopped = time.monotonic()
                try:
                    assert await eventually(lambda: stalled.lease_lost, 30)
                    assert await eventually(lambda: unbounded.lease_lost, 30)
                    assert time.monotonic() - stopped < 30  # the 100 s timeout did not matter
                    await asyncio.sleep(max(0.0, 3.0 - (time.monotonic() - stopped)))
                    assert not elsewhere.lease_lost
                    assert await elsewhere.owned()
                finally:
                    os.kill(fresh_server.pid, signal.SIGCONT)
                await elsewhere.release()
                stalled.detach()
                unbounded.detach()

        run(fresh_server.url, scenario, socket_timeout=100)


# -- errors -----------------------------------------------------------------------------------


def test_every_call_is_bounded_when_the_client_sets_no_timeout(
    fresh_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a client that has no socket timeout, a stopped server ends an acquire with
    LockBackendError (also a redis.RedisError) after the library's bound, never a hang nor
    a silent False."""
    monkeypatch.setattr(aio_engine, "DEFAULT_CALL_TIMEOUT", 0.5)

    async def scenario(client: redis.asyncio.Redis) -> None:
        lock = AsyncRedisLock(client, "bounded", timeout=5)
        assert await lock.acquire(blocking=False)  # connected and scripts loaded
        await lock.release()
        assert fresh_server.pid is not None
        os.kill(fresh_server.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(LockBackendError) as caught:
                await lock.acquire(blocking=False)
            assert time.monotonic() - started < 0.5 + 15  # bounded: spare for a busy machine
            assert isinstance(caught.value, redis.RedisError)
            assert isinstance(caught.value.__cause__, redis.TimeoutError)
        finally:
            os.kill(fresh_server.pid, signal.SIGCONT)

    run(fresh_server.url, scenario)


def test_an_unreachable_server_raises_lock_backend_error(key: str) -> None:
    async def scenario(client: redis.asyncio.Redis) -> None:
        lock = AsyncRedisLock(client, key, timeout=5)
        with pytest.raises(LockBackendError, match="Redis error"):
            await lock.acquire(blocking=False)
        with pytest.raises(LockBackendError):
            await lock.locked()

    run(f"redis://127.0.0.1:{free_port()}/0", scenario, socket_timeout=2)


def test_scripts_reload_after_script_flush(
    redis_server: RedisServer, client: redis.Redis, key: str
) -> None:
    async def scenario(aclient: redis.asyncio.Redis) -> None:
        lock = AsyncRedisLock(aclient, key, timeout=5)
        client.script_flush()
        assert await lock.acquire(blocking=False)
        client.script_flush()
        await lock.extend()
        client.script_flush()
        await lock.release()

    run(redis_server.url, scenario)


def test_arguments_are_checked_as_the_sync_engine_checks_them(
    redis_server: RedisServer, client: redis.Redis, key: str
) -> None:
    async def scenario(aclient: redis.asyncio.Redis) -> None:
        for bad in (0, -1, math.nan, math.inf, True, "5"):
            with pytest.raises(ValueError, match="timeout"):
                AsyncRedisLock(aclient, key, timeout=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="claim"):
            AsyncRedisLock(aclient, key, claim="a:b")
        with pytest.raises(ValueError, match="limit"):
            AsyncRedisLock(aclient, key, limit=0)
        with pytest.raises(ValueError, match="hash tag"):
            AsyncRedisLock(aclient, "a}b")
        with pytest.raises(ValueError, match="scripting=False"):
            AsyncRedisLock(aclient, key, scripting=False)
        with pytest.raises(TypeError, match=r"redis\.asyncio\.Redis"):
            AsyncRedisLock(client, key)  # type: ignore[arg-type]
        lock = AsyncRedisLock(aclient, key)
        for wait in (math.nan, -1.0):
            with pytest.raises(ValueError, match="acquire timeout"):
                await lock.acquire(timeout=wait)

    run(redis_server.url, scenario)


# -- values planted by others -----------------------------------------------------------------


@pytest.mark.parametrize("unit", ["seconds", "milliseconds", "float-seconds"])
def test_classic_timestamp_in_the_future_is_honoured(
    redis_server: RedisServer, client: redis.Redis, key: str, unit: str
) -> None:
    until = int(client.time()[0]) + 30
    value = {
        "seconds": str(until),
        "milliseconds": str(until * 1000),
        "float-seconds": f"{until}.25",
    }
    client.set(key, value[unit])

    async def scenario(aclient: redis.asyncio.Redis) -> None:
        lock = AsyncRedisLock(aclient, key)
        assert await lock.locked()
        assert not await lock.acquire(blocking=False)
        assert client.get(key) == value[unit].encode()

    run(redis_server.url, scenario)


def test_classic_timestamp_in_the_past_is_taken_over(
    redis_server: RedisServer, client: redis.Redis, key: str
) -> None:
    client.set(key, str(int(client.time()[0]) - 5))

    async def scenario(aclient: redis.asyncio.Redis) -> None:
        lock = AsyncRedisLock(aclient, key)
        assert not await lock.locked()
        assert await lock.acquire(blocking=False)
        assert await lock.owned()
        await lock.release()

    run(redis_server.url, scenario)


def test_garbage_value_with_ttl_is_held_until_it_expires(
    redis_server: RedisServer, client: redis.Redis, key: str
) -> None:
    client.set(key, b"\xff\x00not-a-lock:::", px=400)

    async def scenario(aclient: redis.asyncio.Redis) -> None:
        lock = AsyncRedisLock(aclient, key)
        assert await lock.locked()
        assert not await lock.acquire(blocking=False)
        assert await lock.acquire(timeout=3)
        await lock.release()

    run(redis_server.url, scenario)


def test_foreign_value_without_ttl_raises_and_is_never_overwritten(
    redis_server: RedisServer, client: redis.Redis, key: str
) -> None:
    client.set(key, "hello: world")

    async def scenario(aclient: redis.asyncio.Redis) -> None:
        lock = AsyncRedisLock(aclient, key)
        assert not await lock.locked()
        with pytest.raises(LockBackendError, match=f"never overwritten silently.*{key}"):
            await lock.acquire(blocking=False)
        with pytest.raises(LockBackendError, match="never overwritten silently"):
            await lock.acquire(timeout=0.5)

    run(redis_server.url, scenario)
    assert client.get(key) == b"hello: world"
    assert client.ttl(key) == -1


def test_wrong_key_type_raises_a_clear_error(
    redis_server: RedisServer, client: redis.Redis, key: str
) -> None:
    client.rpush(key, "x")

    async def scenario(aclient: redis.asyncio.Redis) -> None:
        with pytest.raises(LockBackendError, match="WRONGTYPE"):
            await AsyncRedisLock(aclient, key).acquire(blocking=False)

    run(redis_server.url, scenario)


# -- slots and claim --------------------------------------------------------------------------


def test_slots_admit_at_most_limit_holders_of_both_engines(
    redis_server: RedisServer, client: redis.Redis, key: str
) -> None:
    """Three holders (two async, one sync) take the three slots and a fourth is refused;
    when one releases, the fourth gets that slot; holders() lists them all."""

    async def scenario(aclient: redis.asyncio.Redis) -> None:
        first, second = (AsyncRedisLock(aclient, key, timeout=10, limit=3) for _ in range(2))
        third = RedisLock(client, key, timeout=10, limit=3)
        assert await first.acquire(blocking=False)
        assert await second.acquire(blocking=False)
        assert third.acquire(blocking=False)
        fourth = AsyncRedisLock(aclient, key, timeout=10, limit=3)
        assert not await fourth.acquire(blocking=False)
        assert len(await fourth.holders()) == 3
        assert await fourth.locked()
        assert (await fourth.holder()) is not None
        await second.release()
        assert await fourth.acquire(blocking=False)
        assert await fourth.owned()
        assert not await second.owned()
        assert fourth.held_key in fourth.slot_keys()
        await first.release()
        third.release()
        await fourth.release()
        assert not await fourth.locked()

    run(redis_server.url, scenario)


def test_twelve_tasks_never_exceed_three_inside(redis_server: RedisServer, key: str) -> None:
    """Twelve tasks, 15 rounds each, on a three-slot lock: never more than three inside,
    every slot used, every fencing token distinct."""
    inside = {"now": 0, "most": 0}
    fences: list[int] = []
    used: set[str] = set()

    async def scenario(client: redis.asyncio.Redis) -> None:
        async def work() -> None:
            lock = AsyncRedisLock(client, key, timeout=10, limit=3, fallback_poll=0.2)
            for _ in range(15):
                assert await lock.acquire(timeout=30)
                inside["now"] += 1
                inside["most"] = max(inside["most"], inside["now"])
                fences.append(lock.fencing_token or 0)
                used.add(lock.held_key)
                await asyncio.sleep(0.002)
                inside["now"] -= 1
                await lock.release()

        await asyncio.gather(*(work() for _ in range(12)))

    run(redis_server.url, scenario)
    assert inside["most"] == 3
    assert len(used) == 3
    assert len(set(fences)) == 12 * 15


def test_a_group_never_holds_two_slots(redis_server: RedisServer, key: str) -> None:
    async def scenario(client: redis.asyncio.Redis) -> None:
        one = AsyncRedisLock(client, key, timeout=10, limit=3, group="task-1")
        two = AsyncRedisLock(client, key, timeout=10, limit=3, group="task-1")
        other = AsyncRedisLock(client, key, timeout=10, limit=3, group="task-2")
        assert await one.acquire(blocking=False)
        assert not await two.acquire(blocking=False)
        assert await other.acquire(blocking=False)
        await one.release()
        assert await two.acquire(blocking=False)
        await two.release()
        await other.release()

    run(redis_server.url, scenario)


def test_claim_takes_over_a_hold_atomically_keeping_its_fencing_token(
    redis_server: RedisServer, client: redis.Redis, key: str
) -> None:
    """An async lock built with ``claim=T`` takes over the hold of owner token T (here a
    sync lock's, as a queued task's would be); a second claimant of T then contends, and T
    itself no longer owns anything."""

    async def scenario(aclient: redis.asyncio.Redis) -> None:
        queued = RedisLock(client, key, token="q-1", timeout=30)
        assert queued.acquire(blocking=False)
        fence = queued.fencing_token
        first = AsyncRedisLock(aclient, key, token="r-1", claim="q-1", timeout=30)
        assert await first.acquire(blocking=False)
        assert first.fencing_token == fence
        assert await first.owned()
        assert not queued.owned()
        second = AsyncRedisLock(aclient, key, token="r-2", claim="q-1", timeout=30)
        assert not await second.acquire(blocking=False)
        with pytest.raises(LockNotOwned):
            queued.release()
        assert await first.owned()
        await first.release()
        assert await second.acquire(blocking=False)
        assert second.fencing_token is not None
        assert fence is not None
        assert second.fencing_token > fence
        await second.release()

    run(redis_server.url, scenario)


def test_holder_info_is_stored_with_the_lock(
    redis_server: RedisServer, client: redis.Redis, key: str
) -> None:
    async def scenario(aclient: redis.asyncio.Redis) -> None:
        lock = AsyncRedisLock(aclient, key, timeout=5, holder_info={"host": "web-1", "pid": 812})
        assert await lock.acquire(blocking=False)
        _expiry, flag, token, fence, info = client.get(key).decode().split(":", 4)  # type: ignore[union-attr]
        assert flag == "0"
        assert token == lock.token
        assert int(fence) == lock.fencing_token
        assert info == '{"host": "web-1", "pid": 812}'
        seen_by_sync = RedisLock(client, key).holder()
        seen_by_async = await AsyncRedisLock(aclient, key).holder()
        assert seen_by_sync is not None
        assert seen_by_async is not None
        assert seen_by_async.info == seen_by_sync.info == {"host": "web-1", "pid": 812}
        assert (seen_by_async.token, seen_by_async.fence) == (lock.token, lock.fencing_token)
        await lock.release()

    run(redis_server.url, scenario)


def test_a_waiter_cancelled_twice_as_the_lock_is_handed_to_it_leaves_it_free(
    redis_server: RedisServer, client: redis.Redis, key: str
) -> None:
    """A waiter whose task is cancelled, then cancelled again 0-2 ms later (as anyio and
    Starlette cancel scopes and nested timeouts do), just after the holder's release
    handed it the lock: in every one of 200 rounds, once the waiter's task is over, either
    its acquire finished (and it releases), or the clean-up that gives back the grant the
    caller never saw has run to its end through the second cancellation. Each round is
    its own event loop, which ends as soon as the waiter's task is over (as a server
    shutting down does), so a clean-up left running in the background would be cut off
    there and the key would stay held by nobody for its 300 s lease: after each round
    the key is gone, or a non-blocking acquire gets it."""
    rng = random.Random(31)
    outcomes: list[str] = []
    # Odd rounds release only after the first cancel, so at least those end cancelled
    # whatever the timing (the race of even rounds may always go to the acquire).
    release_first = True

    async def round_(aclient: redis.asyncio.Redis) -> None:
        holder = AsyncRedisLock(aclient, key, timeout=300)
        waiter = AsyncRedisLock(aclient, key, timeout=300, fallback_poll=30.0)
        assert await holder.acquire(blocking=False)
        waiting = asyncio.create_task(waiter.acquire(timeout=120))
        queue = holder.protocol.queue_key
        assert await eventually(lambda: client.zcard(queue) == 1, 30)  # queued, blocked
        if release_first:
            await holder.release()  # hands the lock to the waiter
        waiting.cancel()
        await asyncio.sleep(rng.uniform(0, 0.002))
        if not release_first:
            await holder.release()  # may hand the lock to the waiter as it leaves
        waiting.cancel()
        try:
            got = await waiting
        except asyncio.CancelledError:
            got = False
        if got:
            await waiter.release()
        outcomes.append("acquired" if got else "cancelled")

    for index in range(200):
        release_first = index % 2 == 0
        run(redis_server.url, round_)
        fresh = RedisLock(client, key, timeout=300)
        assert not client.exists(key) or fresh.acquire(blocking=False), (
            index,
            outcomes[-1],
            fresh.holder(),
        )
        if fresh.fencing_token is not None:
            fresh.release()
    assert "cancelled" in outcomes
