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
    conn = redis.Redis.from_url(redis_server.url, socket_connect_timeout=10)
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


#: Tests that start a ``celery`` (or ``pytest``) process for each of their steps, or a
#: RabbitMQ node: the CLI's tests, the transcripts of its docs, the pytest plugin's inner
#: suites. A start takes about a second on a quiet machine and tens of seconds on one
#: running a second copy of the suite, and a test takes up to a dozen.
_PROCESS_PER_STEP = (
    "tests/cli/",
    "tests/docs/test_generated.py::test_the_cli_transcripts",
    "tests/plugin/",
    "tests/worker/test_rabbitmq.py",
)
_PROCESS_PER_STEP_TIMEOUT = 600


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give the tests that start a process per step a bound that a loaded machine keeps."""
    for item in items:
        if item.nodeid.startswith(_PROCESS_PER_STEP) and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(_PROCESS_PER_STEP_TIMEOUT))
