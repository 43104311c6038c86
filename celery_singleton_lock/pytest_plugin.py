"""Pytest fixtures for test suites of locked Celery tasks (opt-in).

Load it in one of three ways (installing the package alone changes nothing in a suite)::

    pytest -p celery_singleton_lock.pytest_plugin             # command line
    pytest_plugins = ("celery_singleton_lock.pytest_plugin",)  # the rootdir's conftest.py
    [tool.pytest.ini_options]                                 # pyproject.toml (or pytest.ini)
    singleton_lock_fixtures = true

Fixtures:

``singleton_lock_redis`` (session)
    A private ``redis-server`` on a free loopback port (``$REDIS_SERVER``, ``redis-server``
    or ``valkey-server`` on PATH, else the embedded server of the ``demo`` extra), stopped
    by PID at the end. Only started when something asks for it.
``singleton_lock_url`` (session)
    The lock Redis URL: that server's. Override this fixture to use a Redis of your own.
``singleton_lock_prefix`` (session)
    A ``singleton_lock_prefix`` unique to the session, so suites sharing a Redis never
    see each other's locks.
``singleton_lock_config`` (session)
    ``{"singleton_lock_url": ..., "singleton_lock_prefix": ...}``: merge it into Celery's
    ``celery_config`` fixture or into ``app.conf``.
``singleton_lock_app``
    A Celery app configured with those settings, an in-memory broker and result backend.
``singleton_locks``
    A :class:`SingletonLocks` for the session's prefix: the locks held, and assertions
    such as ``assert_free(task.lock_key(...))`` and ``assert_no_locks()``. Each test starts
    with nothing under the prefix: no locks, and none of the state the modes keep beside
    them (throttle starts, pending follow-ups, debounce bursts, waiters, records of
    finished and skipped runs), so one test's calls never throttle, coalesce or skip the
    next test's.

The fixtures work beside Celery's in-process ``celery_app`` / ``celery_worker`` fixtures
and beside pytest-celery 1.x (see docs/testing.md for both styles).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_singleton_lock.client import LockClient, client_from_url, redis_for
from celery_singleton_lock.config import settings_for
from celery_singleton_lock.modes.parking import parking_index
from celery_singleton_lock.ops.admin import (
    LockRow,
    delete_locks,
    prefix_pattern,
    read_locks,
    scan_pages,
)
from celery_singleton_lock.testing import RedisServer

__all__ = [
    "SingletonLocks",
    "singleton_lock_app",
    "singleton_lock_config",
    "singleton_lock_prefix",
    "singleton_lock_redis",
    "singleton_lock_url",
    "singleton_locks",
]

#: How long the assertions wait, by default, for a lock to reach the asserted state: locks
#: are taken and freed by other processes (workers, queued messages) a moment apart from
#: what the test sees.
DEFAULT_WAIT = 5.0
_POLL = 0.02


class SingletonLocks:
    """The locks under one prefix of one lock Redis, for assertions in tests."""

    def __init__(self, client: LockClient, prefix: str) -> None:
        self.client = client
        self.prefix = prefix

    @classmethod
    def for_app(cls, app: Celery) -> SingletonLocks:
        """The locks of ``app``: its lock Redis (``singleton_lock_url``) and prefix."""
        settings = settings_for(app)
        return cls(redis_for(app, settings.url), settings.prefix)

    def rows(self) -> list[LockRow]:
        """Every lock of this package under the prefix that is held now (SCAN, server clock)."""
        rows = read_locks(self.client, prefix_pattern(self.prefix), foreign=False)
        return [row for row in rows if row.kind == "lock" and row.held]

    def held(self) -> list[str]:
        """The keys of the locks held now, sorted."""
        return [row.key for row in self.rows()]

    def holder(self, key: str) -> LockRow | None:
        """The row of lock ``key`` (task id, task, host/pid, lease left) while held."""
        return next((row for row in self.rows() if row.key == key), None)

    def _until(self, done: Any, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL)
        return True

    def assert_free(self, key: str, timeout: float = DEFAULT_WAIT) -> None:
        """Assert that ``key`` (e.g. ``task.lock_key(...)``) is free, waiting at most
        ``timeout`` seconds for a release that is on its way."""
        if not self._until(lambda: self.holder(key) is None, timeout):
            row = self.holder(key)
            who = f"task {row.task} [{row.task_id}]" if row else "someone"
            raise AssertionError(f"lock {key!r} is still held by {who} after {timeout:g} s")

    def assert_held(
        self, key: str, task_id: str | None = None, timeout: float = DEFAULT_WAIT
    ) -> None:
        """Assert that ``key`` is held (by ``task_id`` when given), waiting at most
        ``timeout`` seconds for the run to take it."""

        def matches() -> bool:
            row = self.holder(key)
            return row is not None and (task_id is None or row.task_id == task_id)

        if not self._until(matches, timeout):
            row = self.holder(key)
            found = f"held by {row.task_id}" if row else "free"
            want = f"held by {task_id}" if task_id else "held"
            raise AssertionError(f"lock {key!r} is {found}, expected {want} within {timeout:g} s")

    def assert_no_locks(self, timeout: float = DEFAULT_WAIT) -> None:
        """Assert that no lock is held under the prefix, waiting at most ``timeout`` s."""
        if not self._until(lambda: not self.held(), timeout):
            listed = ", ".join(f"{row.key} ({row.task} [{row.task_id}])" for row in self.rows())
            raise AssertionError(f"locks left after {timeout:g} s: {listed}")

    def clear(self) -> int:
        """Delete every lock under the prefix (as ``clear_locks`` does); returns how many."""
        rows = read_locks(self.client, prefix_pattern(self.prefix), foreign=False)
        return delete_locks(self.client, [row.key for row in rows if row.kind == "lock"])

    def reset(self) -> int:
        """Delete every key under the prefix: the locks, every key kept beside them (the
        companions ``<prefix>:<task>:{<digest>}:<suffix>``: waiters, slots, fencing
        counters, throttle starts, follow-ups, debounce bursts, finished runs), the records
        of skipped runs (``<prefix>~skipped:<task id>``) and the worker sweep's list
        (``{<prefix>}~parking``); returns how many keys went. Found with SCAN, never KEYS;
        a prefix is the package's namespace, so use a prefix of the tests' own (the
        ``singleton_lock_prefix`` fixture is one)."""
        base = prefix_pattern(self.prefix).removesuffix(":*")
        deleted = 0
        for pattern in (f"{base}:*", f"{base}~*"):
            for page in scan_pages(self.client, pattern):
                pipe = self.client.pipeline(transaction=False)
                for key in page:
                    pipe.delete(key)  # one key per DEL: keys of many cluster slots
                deleted += sum(int(gone) for gone in pipe.execute())
        return deleted + int(self.client.delete(parking_index(self.prefix)))


@pytest.fixture(scope="session")
def singleton_lock_redis() -> Iterator[RedisServer]:
    """A private redis-server for the locks, for the whole session."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def singleton_lock_url(singleton_lock_redis: RedisServer) -> str:
    """The lock Redis URL (the private server's); override to use your own."""
    return singleton_lock_redis.url


@pytest.fixture(scope="session")
def singleton_lock_prefix() -> str:
    """A lock prefix unique to this session."""
    return f"csltest-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="session")
def singleton_lock_config(singleton_lock_url: str, singleton_lock_prefix: str) -> dict[str, Any]:
    """The settings that point an app's locks at the test Redis and prefix."""
    return {
        "singleton_lock_url": singleton_lock_url,
        "singleton_lock_prefix": singleton_lock_prefix,
    }


@pytest.fixture
def singleton_lock_app(singleton_lock_config: dict[str, Any]) -> Iterator[Celery]:
    """A Celery app with an in-memory broker and result backend, locking on the test
    Redis; not the current or default app."""
    app = Celery(
        f"singleton-lock-test-{uuid.uuid4().hex[:6]}",
        broker="memory://",
        backend="cache+memory://",
        set_as_current=False,
    )
    app.conf.update(singleton_lock_config)
    yield app
    app.close()


@pytest.fixture
def singleton_locks(
    singleton_lock_url: str, singleton_lock_prefix: str
) -> Iterator[SingletonLocks]:
    """Inspect and assert on the locks under the session's prefix; each test starts with
    nothing under it (no locks, no mode state, no skip records)."""
    client = client_from_url(singleton_lock_url)
    locks = SingletonLocks(client, singleton_lock_prefix)
    locks.reset()
    yield locks
    client.close()
