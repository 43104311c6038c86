"""``clear_locks(app, pattern)`` on a real redis-server: it removes this app's locks that
match, with their waiters' signal lists, and never any other key."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
import redis
from celery import Celery

from celery_singleton_lock import RedisLock, clear_locks
from celery_singleton_lock.engine.keyspace import companion_key
from celery_singleton_lock.testing import RedisServer


@pytest.fixture
def app(redis_server: RedisServer) -> Celery:
    app = Celery("clearing", broker="memory://", set_as_current=False)
    app.conf.singleton_lock_url = redis_server.url
    app.conf.singleton_lock_prefix = f"clr{uuid.uuid4().hex[:8]}"
    return app


def _hold(client: redis.Redis, key: str) -> RedisLock:
    lock = RedisLock(client, key, timeout=30)
    assert lock.acquire(blocking=False)
    return lock


def test_clears_only_matching_locks_of_this_app(app: Celery, client: redis.Redis) -> None:
    prefix = app.conf.singleton_lock_prefix
    billing = [f"{prefix}:billing.charge:{{{n}}}" for n in range(3)]
    other = f"{prefix}:shop.buy:{{1}}"
    for key in [*billing, other]:
        _hold(client, key)
    user_data = f"{prefix}:billing.notes"  # a string under the prefix that is no lock
    classic = f"{prefix}:billing.classic"  # another language's SETNX timestamp
    outside = f"billing.charge:{prefix}"  # not under the prefix at all
    client.set(user_data, "keep me")
    client.set(classic, str(int(time.time()) + 600))
    client.set(outside, "keep me too")

    assert clear_locks(app, "billing.*") == 3
    for key in billing:
        assert client.exists(key) == 0
    assert client.exists(other) == 1
    assert client.get(user_data) == b"keep me"
    assert client.exists(classic) == 1
    assert client.get(outside) == b"keep me too"

    assert clear_locks(app) == 1  # "*": the rest of this app's locks
    assert client.exists(other) == 0
    assert clear_locks(app) == 0
    assert client.get(user_data) == b"keep me"


def test_a_waiter_is_not_left_behind(app: Celery, client: redis.Redis) -> None:
    """Clearing a lock with a blocked waiter wakes it: it takes the lock at once, not at
    its next fallback poll (60 s here) nor at the cleared hold's lease end (30 s): both lie
    beyond its 20 s acquire timeout, so getting in at all proves the wake-up."""
    key = f"{app.conf.singleton_lock_prefix}:jobs.one:{{x}}"
    _hold(client, key)
    waiter = RedisLock(client, key, timeout=30, fallback_poll=60)
    got: list[bool] = []
    thread = threading.Thread(target=lambda: got.append(waiter.acquire(timeout=20)))
    thread.start()
    time.sleep(0.3)
    assert clear_locks(app, "jobs.*") == 1
    thread.join(timeout=30)
    assert got == [True]
    waiter.release()
    assert client.pttl(companion_key(key, "signal")) > 0 or not client.exists(
        companion_key(key, "signal")
    )


def test_pattern_with_the_prefix_is_taken_as_is(app: Celery, client: redis.Redis) -> None:
    prefix = app.conf.singleton_lock_prefix
    _hold(client, f"{prefix}:a.b:{{1}}")
    assert clear_locks(app, f"{prefix}:a.*") == 1
