"""Fixtures for lock-engine tests: every behavioural test runs in both protocol modes."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from celery_singleton_lock import RedisLock
from celery_singleton_lock.engine.keyspace import companion_key


@pytest.fixture(params=[True, False], ids=["scripting", "plain"])
def scripting(request: pytest.FixtureRequest) -> bool:
    """Run the test once with Lua scripts and once with plain commands."""
    return bool(request.param)


@pytest.fixture
def make_lock(client: redis.Redis, key: str, scripting: bool) -> Any:
    """Build RedisLock instances on the test's key in the test's protocol mode."""

    def make(name: str | None = None, **kwargs: Any) -> RedisLock:
        kwargs.setdefault("scripting", scripting)
        return RedisLock(kwargs.pop("client", client), name or key, **kwargs)

    return make


def wait_queued(client: redis.Redis, key: str, count: int) -> None:
    """Return once ``count`` waiters have their place in ``key``'s queue (bounded: 120 s,
    for a loaded machine), instead of sleeping and hoping they have."""
    deadline = time.monotonic() + 120
    while client.zcard(companion_key(key, "queue")) < count:
        assert time.monotonic() < deadline, f"fewer than {count} waiters queued"
        time.sleep(0.01)
