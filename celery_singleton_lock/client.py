"""Redis clients for the lock, one per (Celery app, process), created lazily.

Each app gets its own client from its own ``singleton_lock_url``; a forked child (a
prefork pool process) never reuses its parent's sockets: the cache is keyed by PID.
"""

from __future__ import annotations

import os
import re
import threading
import weakref
from typing import Any
from urllib.parse import parse_qs, urlsplit

import redis
from redis.cluster import RedisCluster
from redis.sentinel import Sentinel

from celery_singleton_lock.engine.wire import LockClient

__all__ = [
    "REDIS_URL_SCHEMES",
    "LockClient",
    "client_from_url",
    "mask_url",
    "redis_for",
    "url_error",
    "url_scheme",
]

#: URL schemes the lock's Redis may use (and a broker URL must use to be borrowed).
REDIS_URL_SCHEMES = (
    "redis",
    "rediss",
    "unix",
    "redis+socket",
    "sentinel",
    "redis+cluster",
    "rediss+cluster",
)
#: Schemes whose ``scheme://user@host`` is read as a user without a password.
_KNOWN_SCHEMES = frozenset(
    (*REDIS_URL_SCHEMES, "valkey", "valkeys", "http", "https", "amqp", "amqps")
)
_MASK = "**"
#: A URL scheme at the start of a text (``redis://``, ``rediss+cluster://`` ...).
_SCHEME = re.compile(r"\s*[A-Za-z][A-Za-z0-9+.-]*://")
#: Where a multi-host or Sentinel value starts its next URL: a ``;`` followed by a scheme
#: (a ``;`` inside a password is not followed by one, so it never splits a password).
_NEXT_URL = re.compile(r";(?=\s*[A-Za-z][A-Za-z0-9+.-]*://)")
#: A query parameter whose name says it holds a secret (``password=``,
#: ``sentinel_password=``, ``token=`` ...): its value is masked.
_QUERY_SECRET = re.compile(
    r"([?&][^=&#]*?(?:password|passwd|pwd|secret|token|credential)[^=&#]*=)[^&#]*",
    re.IGNORECASE,
)

#: Per app: (the PID that built them, {URL: client}).
_cache: weakref.WeakKeyDictionary[Any, tuple[int, dict[str, LockClient]]] = (
    weakref.WeakKeyDictionary()
)
_guard = threading.Lock()

# Generous enough for a loaded server, short enough that "Redis down" is noticed in seconds.
#: Seconds any lock command may take before it fails (redis-py 5 and 6 wait forever by
#: default): a stalled Redis ends a call, never hangs a task. A URL query such as
#: ``?socket_timeout=10&socket_connect_timeout=2`` overrides it.
DEFAULT_SOCKET_TIMEOUT = 5.0

_CLIENT_OPTIONS: dict[str, Any] = {
    "socket_timeout": DEFAULT_SOCKET_TIMEOUT,
    "socket_connect_timeout": DEFAULT_SOCKET_TIMEOUT,
    "socket_keepalive": True,
    "health_check_interval": 30,
}


_CLUSTER_OPTIONS: dict[str, Any] = {
    "socket_timeout": DEFAULT_SOCKET_TIMEOUT,
    "socket_connect_timeout": DEFAULT_SOCKET_TIMEOUT,
    "socket_keepalive": True,
}


def url_scheme(url: str) -> str:
    """The lowercased scheme of a URL, ``""`` when it has none."""
    head, sep, _ = url.partition("://")
    return head.strip().lower() if sep else ""


def _mask_one(part: str) -> str:
    """One URL (or anything shaped like one) with its credentials masked: whatever lies
    between the first ``:`` after the scheme (or the start, when there is no scheme) and
    the last ``@`` is a password, however malformed (a ``/``, ``@`` or ``;`` inside it
    included); ``user@host`` carries none. Secret query parameters are masked too."""
    scheme = _SCHEME.match(part)
    start = scheme.end() if scheme else 0
    at = part.rfind("@")
    if at >= start:
        colon = part.find(":", start, at)
        if colon == -1 and scheme and url_scheme(part) not in _KNOWN_SCHEMES:
            # ``name://x@host`` with a name that is no scheme: as likely a scheme-less
            # ``user:secret@host`` whose secret starts with ``//``.
            colon = part.find(":")
        if colon != -1:
            part = f"{part[: colon + 1]}{_MASK}{part[at:]}"
    return _QUERY_SECRET.sub(rf"\1{_MASK}", part)


def mask_url(url: object) -> str:
    """``url`` with every password replaced by ``**``, whatever its shape: with or without
    a scheme (``user:secret@host``), a password only (``:secret@host``), percent-encoded
    or malformed, each URL of a ``;``-separated multi-host or Sentinel list, and query
    parameters such as ``password=``. Never raises; anything that is not a string is
    masked as its ``str()``. A URL without a password (``user@host``) is left as it is."""
    text = str(url)
    return ";".join(_mask_one(part) for part in _NEXT_URL.split(text))


def url_error(url: object) -> str | None:
    """Why ``url`` cannot be the lock's Redis URL, or None when it can: a known scheme, a
    parsable host and a port in range for every ``;``-separated part."""
    if not isinstance(url, str) or not url.strip():
        return "must be a Redis URL string"
    schemes = ", ".join(f"{scheme}://" for scheme in REDIS_URL_SCHEMES)
    for raw in url.split(";"):
        part = raw.strip()
        if url_scheme(part) not in REDIS_URL_SCHEMES:
            return f"must be a Redis URL ({schemes})"
        try:
            parsed = urlsplit(part)
            port = parsed.port
        except ValueError:
            return "has a malformed host or port"
        if port is not None and not 0 < port < 65536:
            return "has a port outside 1-65535"
    return None


def client_from_url(
    url: str, master_name: str | None = None, socket_timeout: float | None = None
) -> LockClient:
    """A redis-py client for ``url``: redis://, rediss://, unix://, redis+socket://,
    redis+cluster:// or rediss+cluster:// (any node of a Redis Cluster), or
    sentinel://host:port[;sentinel://host2:port]/db (master name from ``master_name`` or
    the ``master_name`` query parameter). ``socket_timeout`` (seconds) replaces the
    default bound of every call and connect (a timeout in the URL's query still wins)."""
    timeout = DEFAULT_SOCKET_TIMEOUT if socket_timeout is None else socket_timeout
    bounds = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
    client_options = {**_CLIENT_OPTIONS, **bounds}
    if url.startswith("redis+socket://"):
        url = "unix://" + url[len("redis+socket://") :]
    for scheme in ("redis+cluster://", "rediss+cluster://"):
        if url.startswith(scheme):
            plain = scheme.replace("+cluster", "") + url[len(scheme) :]
            return RedisCluster.from_url(plain, **{**_CLUSTER_OPTIONS, **bounds})
    if url.startswith("unix://"):
        # A unix-socket connection takes no TCP keepalive option.
        unix = {name: value for name, value in client_options.items() if name != "socket_keepalive"}
        return redis.Redis.from_url(url, **unix)
    if not url.startswith("sentinel://"):
        return redis.Redis.from_url(url, **client_options)
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
    sentinel = Sentinel(hosts, **bounds)  # type: ignore[no-untyped-call]
    master: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
        master_name, db=db, password=password, username=username, **client_options
    )
    return master


def redis_for(app: Any, url: str) -> LockClient:
    """The lock client of ``app`` for ``url`` in this process (rebuilt after fork). An app
    may lock on more than one URL (the compat base classes read their own settings), so
    each URL keeps its client."""
    pid = os.getpid()
    with _guard:
        cached = _cache.get(app)
        if cached is None or cached[0] != pid:
            cached = (pid, {})
            _cache[app] = cached
        client = cached[1].get(url)
        if client is None:
            transport = app.conf.get("broker_transport_options") or {}
            client = client_from_url(url, transport.get("master_name"))
            cached[1][url] = client
        return client
