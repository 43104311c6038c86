"""``LockBackendError`` is also a ``redis.RedisError``, and the engine's error mapping never
wraps one of its own errors a second time (a real, unreachable loopback port stands in for
a Redis that is down)."""

from __future__ import annotations

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_singleton_lock.engine.wire import backend_error, call
from celery_singleton_lock.exceptions import LockBackendError, LockError, SingletonLockError
from celery_singleton_lock.testing import free_port


def test_lock_backend_error_is_ours_and_redis_pys() -> None:
    """One class, two families: our LockError tree and redis-py's RedisError."""
    assert issubclass(LockBackendError, LockError)
    assert issubclass(LockBackendError, SingletonLockError)
    assert issubclass(LockBackendError, redis.exceptions.RedisError)
    assert not issubclass(LockError, redis.RedisError)  # only the backend error is redis-py's


def test_call_re_raises_a_lock_backend_error_unchanged() -> None:
    """A LockBackendError (a RedisError now) raised inside call() reaches the caller as the
    very same object, message and cause, not re-wrapped as "Redis error: Redis error: ..."."""
    cause = redis.ConnectionError("Error 111 connecting. Connection refused.")
    inner = LockBackendError("Redis error: Error 111 connecting. Connection refused.", "a")
    inner.__cause__ = cause

    def fails() -> None:
        raise inner

    with pytest.raises(redis.RedisError) as raised:
        call("b", fails)
    assert raised.value is inner
    assert raised.value.__cause__ is cause
    assert str(raised.value) == "Redis error: Error 111 connecting. Connection refused. (lock 'a')"


def test_nested_calls_on_a_down_server_report_the_redis_error_once() -> None:
    """call() around a step that itself uses call() (as the plain-command protocol does)
    against a port where nothing listens: one LockBackendError, caught as a RedisError,
    whose cause is redis-py's ConnectionError and whose message says "Redis error" once."""
    client = redis.Redis(port=free_port(), socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))
    try:
        with pytest.raises(redis.RedisError) as raised:
            call("outer", lambda: call("inner", client.get, "k"))
    finally:
        client.close()
    assert isinstance(raised.value, LockBackendError)
    assert isinstance(raised.value.__cause__, redis.ConnectionError)
    assert raised.value.name == "inner"
    assert str(raised.value).count("Redis error") == 1


def test_backend_error_of_a_backend_error_keeps_its_message() -> None:
    """backend_error() given one of ours (an ``except redis.RedisError`` that caught it)
    returns an error with the same message, never a doubled prefix."""
    inner = LockBackendError("Redis error: timeout", "k")
    again = backend_error(inner, "other")
    assert isinstance(again, LockBackendError)
    assert (again.message, again.name) == ("Redis error: timeout", "k")
