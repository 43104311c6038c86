"""``unless_finished``: a try of the lock first asks, in the same script, whether the run of
a task id finished already (the key's done set, as ``release(record=...)`` writes it), and
takes nothing when it did; the queue scope's late copies cost one round trip, not three
(issue 32). Real redis-server, both engines, one slot and several."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
import redis.asyncio

from celery_singleton_lock import RedisLock
from celery_singleton_lock.aio import AsyncRedisLock
from celery_singleton_lock.engine.keyspace import DONE, companion_key
from celery_singleton_lock.testing import RedisServer


def finish(client: redis.Redis, key: str, task_id: str, **kwargs: Any) -> None:
    """A run of ``task_id`` takes the key and releases it recording that it finished."""
    lock = RedisLock(client, key, **kwargs)
    assert lock.acquire(blocking=False)
    lock.release(record=(companion_key(key, DONE), task_id, 60_000))


@pytest.mark.parametrize("limit", [1, 3])
def test_a_finished_task_id_takes_nothing(client: redis.Redis, key: str, limit: int) -> None:
    finish(client, key, "t-1", limit=limit)
    late = RedisLock(client, key, limit=limit, unless_finished="t-1")
    assert late.checks_finished
    assert late.acquire(blocking=False) is False
    assert late.found_finished
    assert not late.locked()
    assert late.held_back_by is None

    other = RedisLock(client, key, limit=limit, unless_finished="t-2")
    assert other.acquire(blocking=False)
    assert not other.found_finished
    other.release()


def test_a_blocking_try_does_not_wait_for_a_finished_task_id(client: redis.Redis, key: str) -> None:
    finish(client, key, "t-1")
    holder = RedisLock(client, key, timeout=60)
    assert holder.acquire(blocking=False)  # held: a blocking try would queue and wait
    late = RedisLock(client, key, unless_finished="t-1")
    assert late.acquire(blocking=True, timeout=30) is False
    assert late.found_finished
    assert holder.owned()
    holder.release()


def test_without_scripts_nothing_is_checked(client: redis.Redis, key: str) -> None:
    finish(client, key, "t-1")
    lock = RedisLock(client, key, scripting=False, unless_finished="t-1")
    assert not lock.checks_finished
    assert lock.acquire(blocking=False)
    lock.release()


def test_the_asyncio_engine_checks_the_same(redis_server: RedisServer, key: str) -> None:
    client = redis.Redis.from_url(redis_server.url)
    try:
        finish(client, key, "t-1")
    finally:
        client.close()

    async def scenario() -> tuple[bool, bool, bool]:
        aclient = redis.asyncio.Redis.from_url(redis_server.url)
        try:
            late = AsyncRedisLock(aclient, key, unless_finished="t-1")
            other = AsyncRedisLock(aclient, key, unless_finished="t-2")
            taken_late = await late.acquire(blocking=False)
            taken_other = await other.acquire(blocking=False)
            await other.release()
            return taken_late, late.found_finished, taken_other
        finally:
            await aclient.aclose()

    assert asyncio.run(scenario()) == (False, True, True)


def test_unless_finished_must_be_a_task_id(client: redis.Redis, key: str) -> None:
    with pytest.raises(ValueError, match="unless_finished"):
        RedisLock(client, key, unless_finished=5)  # type: ignore[arg-type]
