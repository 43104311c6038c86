"""Fixtures shared by every test folder: private redis-servers and unique key names."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from hypothesis import settings

from celery_singleton_lock.testing import RedisServer

# Property tests share two CPUs with workers and redis-servers: a slow example is load, not
# a failure (each example is still bounded by the test's timeout).
settings.register_profile("loaded", deadline=None)
settings.load_profile("loaded")


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One private redis-server on a free loopback port for the whole session."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A client of the session's private server."""
    conn = redis.Redis.from_url(redis_server.url, socket_connect_timeout=2)
    yield conn
    conn.close()


@pytest.fixture
def key() -> str:
    """A lock name no other test uses (tests share the server, never FLUSHALL)."""
    return f"test:{uuid.uuid4().hex[:12]}"


@pytest.fixture
def fresh_server() -> Iterator[RedisServer]:
    """A redis-server of this test's own, for tests that count commands or stop it."""
    with RedisServer() as server:
        yield server


Factory = Callable[..., Any]
