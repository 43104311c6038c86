"""Values written by others: classic SETNX timestamps and garbage never crash the reader."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from celery_singleton_lock import LockBackendError


def _server_seconds(client: redis.Redis) -> int:
    return int(client.time()[0])


@pytest.mark.parametrize("unit", ["seconds", "milliseconds", "float-seconds"])
def test_classic_timestamp_in_the_future_is_honoured(
    make_lock: Any, client: redis.Redis, key: str, unit: str
) -> None:
    """A plain Unix timestamp (s, ms or fractional s) ahead of server time means held."""
    until = _server_seconds(client) + 30
    value = {
        "seconds": str(until),
        "milliseconds": str(until * 1000),
        "float-seconds": f"{until}.25",
    }
    client.set(key, value[unit])
    lock = make_lock()
    assert lock.locked()
    assert not lock.acquire(blocking=False)
    assert client.get(key) == value[unit].encode()


@pytest.mark.parametrize("unit", ["seconds", "milliseconds"])
def test_classic_timestamp_in_the_past_is_taken_over(
    make_lock: Any, client: redis.Redis, key: str, unit: str
) -> None:
    """An expired plain timestamp is an abandoned lock: it is taken over, never deleted blind."""
    past = _server_seconds(client) - 5
    client.set(key, str(past if unit == "seconds" else past * 1000))
    lock = make_lock()
    assert not lock.locked()
    assert lock.acquire(blocking=False)
    assert lock.owned()


def test_garbage_value_with_ttl_is_held_until_it_expires(
    make_lock: Any, client: redis.Redis, key: str
) -> None:
    """A value in no known format counts as held while the key has a TTL."""
    client.set(key, b"\xff\x00not-a-lock:::", px=400)
    lock = make_lock()
    assert lock.locked()
    assert not lock.acquire(blocking=False)
    assert lock.acquire(timeout=3)


def test_garbage_value_without_ttl_is_never_overwritten(
    make_lock: Any, client: redis.Redis, key: str
) -> None:
    """A value in no known format and with no TTL is not ours to take (issue 22.10): the
    acquire raises a LockError naming the key, and the value stays as it was."""
    client.set(key, "hello: world")
    lock = make_lock()
    assert not lock.locked()
    with pytest.raises(LockBackendError, match=f"never overwritten silently.*{key}"):
        lock.acquire(blocking=False)
    assert client.get(key) == b"hello: world"
    assert client.ttl(key) == -1


def test_wrong_key_type_raises_a_clear_error(make_lock: Any, client: redis.Redis, key: str) -> None:
    """A lock name that holds a list is reported as a LockBackendError, not a crash or False."""
    client.rpush(key, "x")
    with pytest.raises(LockBackendError, match="WRONGTYPE"):
        make_lock().acquire(blocking=False)
