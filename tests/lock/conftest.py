"""Fixtures for lock-engine tests: every behavioural test runs in both protocol modes."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from celery_singleton_lock import RedisLock


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
