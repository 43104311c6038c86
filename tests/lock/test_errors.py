"""Bad input and an unreachable Redis fail loudly and quickly."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
import redis

from celery_singleton_lock import LockBackendError, LockError, RedisLock
from celery_singleton_lock.testing import free_port


@pytest.mark.parametrize("bad", [0, -1, "10", None, True, math.nan, math.inf])
def test_bad_timeout_raises_value_error(client: redis.Redis, bad: Any) -> None:
    """A lease that is not a positive finite number is refused at construction."""
    with pytest.raises(ValueError, match="timeout"):
        RedisLock(client, "x", timeout=bad)


@pytest.mark.parametrize("bad", ["", None, 42])
def test_bad_name_raises_value_error(client: redis.Redis, bad: Any) -> None:
    """The lock name must be a non-empty string."""
    with pytest.raises(ValueError, match="name"):
        RedisLock(client, bad)


def test_bad_token_and_acquire_timeout_raise(client: redis.Redis) -> None:
    """Tokens may not contain the value separator; acquire timeouts may not be negative."""
    with pytest.raises(ValueError, match="token"):
        RedisLock(client, "x", token="a:b")
    with pytest.raises(ValueError, match="timeout"):
        RedisLock(client, "x").acquire(timeout=-1)


@pytest.mark.parametrize("bad", [math.nan, -0.5, "1", True])
def test_bad_acquire_timeout_raises_before_any_command(client: redis.Redis, bad: Any) -> None:
    """A NaN acquire timeout used to make acquire wait forever; it is a ValueError."""
    with pytest.raises(ValueError, match="timeout"):
        RedisLock(client, "x").acquire(timeout=bad)


def test_infinite_acquire_timeout_waits_like_none(client: redis.Redis, key: str) -> None:
    lock = RedisLock(client, key, timeout=5)
    assert lock.acquire(timeout=math.inf)
    lock.release()


@pytest.mark.parametrize("scripting", [True, False])
def test_unreachable_redis_raises_within_bounded_time(scripting: bool) -> None:
    """With nothing listening, acquire raises LockBackendError (a LockError), never returns
    False nor hangs (redis-py's own retry policy, off here, would add its backoff). A
    refused connection answers at once; the bound leaves a busy machine 10 s."""
    dead = redis.Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=0.5, retry=None)
    lock = RedisLock(dead, "x", scripting=scripting)
    started = time.monotonic()
    with pytest.raises(LockBackendError) as caught:
        lock.acquire(timeout=1)
    assert isinstance(caught.value, LockError)
    assert time.monotonic() - started < 1.0 + 10
