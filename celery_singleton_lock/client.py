"""Redis clients for the lock, one per (Celery app, process), created lazily.

Each app gets its own client from its own ``singleton_lock_url``; a forked child (a
prefork pool process) never reuses its parent's sockets: the cache is keyed by PID.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any
from urllib.parse import parse_qs, urlsplit

import redis
from redis.cluster import RedisCluster
from redis.sentinel import Sentinel

__all__ = ["LockClient", "client_from_url", "redis_for"]

#: What the lock runs on: a single Redis (direct or through Sentinel) or a Redis Cluster.
LockClient = redis.Redis | RedisCluster

_cache: weakref.WeakKeyDictionary[Any, tuple[int, str, LockClient]] = weakref.WeakKeyDictionary()
_guard = threading.Lock()

# Generous enough for a loaded server, short enough that "Redis down" is noticed in seconds.
_CLIENT_OPTIONS: dict[str, Any] = {
    "socket_connect_timeout": 5.0,
    "socket_keepalive": True,
    "health_check_interval": 30,
}


_CLUSTER_OPTIONS: dict[str, Any] = {"socket_connect_timeout": 5.0, "socket_keepalive": True}


def client_from_url(url: str, master_name: str | None = None) -> LockClient:
    """A redis-py client for ``url``: redis://, rediss://, unix://, redis+socket://,
    redis+cluster:// or rediss+cluster:// (any node of a Redis Cluster), or
    sentinel://host:port[;sentinel://host2:port]/db (master name from ``master_name`` or
    the ``master_name`` query parameter)."""
    if url.startswith("redis+socket://"):
        url = "unix://" + url[len("redis+socket://") :]
    for scheme in ("redis+cluster://", "rediss+cluster://"):
        if url.startswith(scheme):
            plain = scheme.replace("+cluster", "") + url[len(scheme) :]
            return RedisCluster.from_url(plain, **_CLUSTER_OPTIONS)
    if not url.startswith("sentinel://"):
        return redis.Redis.from_url(url, **_CLIENT_OPTIONS)
    hosts: list[tuple[str, int]] = []
    db: int = 0
    password: str | None = None
    username: str | None = None
    for part in url.split(";"):
        parsed = urlsplit(part.strip())
        hosts.append((parsed.hostname or "127.0.0.1", parsed.port or 26379))
        password = parsed.password or password
        username = parsed.username or username
        if parsed.path.strip("/").isdigit():
            db = int(parsed.path.strip("/"))
        master_name = master_name or next(iter(parse_qs(parsed.query).get("master_name", [])), None)
    if not master_name:
        raise ValueError("a sentinel:// URL needs a master name (?master_name=mymaster)")
    sentinel = Sentinel(hosts, socket_connect_timeout=5.0)  # type: ignore[no-untyped-call]
    master: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
        master_name, db=db, password=password, username=username, **_CLIENT_OPTIONS
    )
    return master


def redis_for(app: Any, url: str) -> LockClient:
    """The lock client of ``app`` in this process (rebuilt after fork or a URL change)."""
    pid = os.getpid()
    with _guard:
        cached = _cache.get(app)
        if cached is not None and cached[0] == pid and cached[1] == url:
            return cached[2]
        transport = app.conf.get("broker_transport_options") or {}
        client = client_from_url(url, transport.get("master_name"))
        _cache[app] = (pid, url, client)
        return client
