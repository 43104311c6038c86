"""Small helpers every Redis-facing module shares: the client type, the server clock,
error mapping and the client's socket timeout. Imports only redis-py."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar, cast

import redis
from redis.cluster import RedisCluster

from celery_singleton_lock.exceptions import LockBackendError

__all__ = [
    "LockClient",
    "Record",
    "at_maxmemory",
    "backend_error",
    "call",
    "reply_bytes",
    "reply_text",
    "server_time",
    "socket_timeout",
    "time_reply",
    "wait_for_replicas",
]

#: What a lock runs on: a single Redis (direct or through Sentinel) or a Redis Cluster.
LockClient = redis.Redis | RedisCluster

_T = TypeVar("_T")

#: ``(done set, task id, keep ms)``: in the same atomic step, the task id is recorded as
#: finished in the lock's done set (``keyspace.DONE``), kept that long, as a release does.
Record = tuple[str, str, int]


def reply_text(part: Any) -> str:
    """One part of a script's reply as text."""
    return part.decode() if isinstance(part, bytes) else str(part)


def reply_bytes(part: Any) -> bytes:
    """One part of a script's reply as bytes."""
    return part if isinstance(part, bytes) else str(part).encode()


def time_reply(reply: Any) -> tuple[int, int]:
    """A ``TIME`` reply ``[seconds, microseconds]`` as (milliseconds, microseconds)."""
    seconds, micros = int(reply[0]), int(reply[1])
    return seconds * 1000 + micros // 1000, seconds * 1_000_000 + micros


def server_time(client: LockClient, key: str | None = None) -> tuple[int, int]:
    """The Redis server's clock as (milliseconds, microseconds).

    On a Redis Cluster the clock is read from the node that owns ``key`` (the one whose
    clock the lock's scripts use), or from a default node without a key.
    """
    if isinstance(client, RedisCluster):
        if key is None:
            return time_reply(client.time())
        node = cast("Any", client).get_node_from_key(key)  # untyped in redis-py
        return time_reply(client.time(target_nodes=node))
    return time_reply(client.time())


def at_maxmemory(error: BaseException | None) -> bool:
    """Whether ``error`` is Redis refusing a write because it is at ``maxmemory``."""
    return isinstance(error, redis.ResponseError) and "used memory > 'maxmemory'" in str(error)


def call(name: str, func: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """Run one Redis call for lock ``name``, turning redis-py errors into LockBackendError.

    A ``LockBackendError`` raised inside ``func`` (itself a ``redis.RedisError``) goes on
    unchanged: it already says what failed, and its ``__cause__`` is the redis-py error
    that callers look at (a lost reply, maxmemory)."""
    try:
        return func(*args, **kwargs)
    except LockBackendError:
        raise
    except (redis.RedisError, redis.exceptions.RedisClusterException) as exc:
        raise backend_error(exc, name) from exc


def backend_error(error: BaseException, name: str) -> LockBackendError:
    """The LockBackendError for a redis-py error about lock ``name`` (given a
    ``LockBackendError``, one with the same message: never "Redis error: Redis error: ...")."""
    if isinstance(error, LockBackendError):
        return LockBackendError(error.message, error.name or name)
    if at_maxmemory(error):
        return LockBackendError(
            "Redis is at maxmemory and refuses writes that need memory (set maxmemory-policy "
            f"or add headroom; see docs/deployment.md): {error}",
            name,
        )
    return LockBackendError(f"Redis error: {error}", name)


def socket_timeout(client: LockClient) -> float | None:
    """The read timeout of ``client``'s connections in seconds, None when unbounded.

    A client built without one (``Redis.from_url(url)``) gets its connection class's
    default: none up to redis-py 7, 5 s from redis-py 8, whose pool then leaves the
    setting out of its options."""
    if isinstance(client, RedisCluster):  # RedisCluster keeps the node options itself
        kwargs = cast("Any", client).get_connection_kwargs() or {}  # untyped in redis-py
        connection_class = kwargs.get("connection_class", redis.Connection)
    else:
        pool = getattr(client, "connection_pool", None)
        kwargs = getattr(pool, "connection_kwargs", {}) or {}
        connection_class = getattr(pool, "connection_class", None)
    value = (
        kwargs["socket_timeout"]
        if "socket_timeout" in kwargs
        else _default_socket_timeout(connection_class)
    )
    return float(value) if value else None


@functools.cache
def _default_socket_timeout(connection_class: type | None) -> float | None:
    """The ``socket_timeout`` a connection of ``connection_class`` has when none is given:
    the default of the first ``__init__`` in its class hierarchy that names it."""
    for klass in getattr(connection_class, "__mro__", ()):
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        try:
            parameter = inspect.signature(init).parameters.get("socket_timeout")
        except (TypeError, ValueError):
            continue
        if parameter is not None and parameter.default is not inspect.Parameter.empty:
            default = parameter.default
            return float(default) if isinstance(default, int | float) else None
    return None


def wait_for_replicas(
    client: LockClient, key: str, marker: str, replicas: int, timeout_ms: int
) -> int:
    """How many replicas of the server that holds ``key`` acknowledged, within
    ``timeout_ms``, every write that server made so far (Redis ``WAIT``).

    ``WAIT`` counts the writes of the connection it is sent on, not the server's: a
    connection that wrote nothing would be answered at once. So one pipeline on one
    connection writes ``marker`` (a short-lived key in ``key``'s hash slot) and then waits:
    the marker comes after every write the caller has seen (its own acquire, or the grant
    another client's release wrote for it), so replicas that have it have those too.
    """
    target: Any = client
    if isinstance(client, RedisCluster):
        node = cast("Any", client).get_node_from_key(key)  # untyped in redis-py
        target = cast("Any", client).get_redis_connection(node)
    pipe = target.pipeline(transaction=False)
    pipe.set(marker, b"1", px=timeout_ms + 1000)
    pipe.execute_command("WAIT", replicas, timeout_ms)
    _, acked = pipe.execute()
    return int(acked)
