"""The locks under comparison, each behind the same two-method adapter.

Every adapter is built once per client and reused across iterations, exactly as an
application would keep one lock object per worker thread. ``acquire(timeout)`` blocks
for at most ``timeout`` seconds using the library's own waiting strategy and returns
whether the lock is now held; ``release()`` gives it back.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import redis

__all__ = [
    "CONTENDERS",
    "FAIR_CONTENDERS",
    "FAIR_MS",
    "Contender",
    "CslLock",
    "LockHandle",
    "make_client",
]


class LockHandle(Protocol):
    """What every scenario needs from a lock."""

    def acquire(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds; True when the lock is held."""
        ...

    def release(self) -> None:
        """Release a held lock."""
        ...


Factory = Callable[[redis.Redis, str, float], LockHandle]


def make_client(url: str, **kwargs: Any) -> redis.Redis:
    """One client with exactly one command connection: the settings every contender gets."""
    return redis.Redis.from_url(url, single_connection_client=True, **kwargs)


class CslLock:
    """Ours: ``celery_singleton_lock.RedisLock``."""

    def __init__(
        self,
        client: redis.Redis,
        key: str,
        lease: float,
        *,
        scripting: bool,
        fallback_poll: float | None = None,
        fair_after: float | None = None,
    ) -> None:
        from celery_singleton_lock import RedisLock  # noqa: PLC0415  (may not exist yet)

        options: dict[str, Any] = {} if fallback_poll is None else {"fallback_poll": fallback_poll}
        if fair_after is not None:
            options["fair_after"] = fair_after
        self._lock = RedisLock(client, key, timeout=lease, scripting=scripting, **options)

    def acquire(self, timeout: float) -> bool:
        return bool(self._lock.acquire(blocking=True, timeout=timeout))

    def release(self) -> None:
        self._lock.release()


class RedisPyLock:
    """redis-py's ``redis.lock.Lock`` (SET NX PX, then sleep ``sleep`` seconds and retry)."""

    def __init__(self, client: redis.Redis, key: str, lease: float, *, sleep: float) -> None:
        self._lock = client.lock(key, timeout=lease, sleep=sleep)

    def acquire(self, timeout: float) -> bool:
        return bool(self._lock.acquire(blocking=True, blocking_timeout=timeout))

    def release(self) -> None:
        self._lock.release()


class PythonRedisLock:
    """python-redis-lock's ``redis_lock.Lock`` (SET NX EX, BLPOP on a signal list).

    Its ``expire`` is whole seconds and its ``acquire(timeout=)`` must not exceed it, so a
    longer wait is a loop of library-sized waits.
    """

    def __init__(self, client: redis.Redis, key: str, lease: float) -> None:
        import redis_lock  # type: ignore[import-untyped]  # noqa: PLC0415

        self._expire = max(1, round(lease))
        self._lock = redis_lock.Lock(client, key, expire=self._expire)

    def acquire(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            step = max(1, min(self._expire, int(deadline - time.monotonic())))
            if self._lock.acquire(blocking=True, timeout=step):
                return True
            if time.monotonic() >= deadline:
                return False

    def release(self) -> None:
        self._lock.release()


class PotteryRedlock:
    """pottery's ``Redlock`` with one master (SET NX PX, random sleep up to 0.2 s)."""

    def __init__(self, client: redis.Redis, key: str, lease: float) -> None:
        from pottery import Redlock  # noqa: PLC0415

        self._lock = Redlock(key=key, masters={client}, auto_release_time=lease)

    def acquire(self, timeout: float) -> bool:
        return bool(self._lock.acquire(blocking=True, timeout=timeout))

    def release(self) -> None:
        self._lock.release()


COMPARE_AND_DELETE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('del', KEYS[1])
end
return 0
"""


class FloorLock:
    """The floor: ``SET key token NX PX`` and a Lua compare-and-delete; no waiting logic.

    When the key is taken it retries immediately (busy spin) until ``timeout``.
    """

    #: The release script: deletes the key when it holds our token.
    RELEASE = COMPARE_AND_DELETE

    def __init__(self, client: redis.Redis, key: str, lease: float) -> None:
        self._client = client
        self._key = key
        self._px = int(lease * 1000)
        self._token = ""
        self._release = client.register_script(self.RELEASE)

    def _take(self, token: str) -> bool:
        """One try at the key under ``token``."""
        return bool(self._client.set(self._key, token, nx=True, px=self._px))

    def acquire(self, timeout: float) -> bool:
        token = secrets.token_hex(16)
        deadline = time.monotonic() + timeout
        while True:
            if self._take(token):
                self._token = token
                return True
            if time.monotonic() >= deadline:
                return False

    def release(self) -> None:
        if not self._release(keys=[self._key], args=[self._token], client=self._client):
            raise RuntimeError(f"floor lock {self._key!r} was not held at release")


@dataclass(frozen=True)
class Contender:
    """A named lock configuration; ``module`` is imported to check it can run at all.

    ``heavy``: keeps a CPU busy while waiting (busy spin or 1 ms polling), so sequential
    scenarios run it after the others.
    """

    name: str
    factory: Factory
    module: str
    distribution: str
    how: str
    heavy: bool = False

    def unavailable(self) -> str | None:
        """None when the contender can run, else the reason it cannot."""
        try:
            module = importlib.import_module(self.module)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        if self.module == "celery_singleton_lock" and not hasattr(module, "RedisLock"):
            return "celery_singleton_lock.RedisLock is not importable yet"
        return None

    def version(self) -> str:
        """Installed version of the distribution providing the lock."""
        try:
            return importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            return "?"


CONTENDERS: dict[str, Contender] = {
    c.name: c
    for c in (
        Contender(
            "csl",
            lambda c, k, lease: CslLock(c, k, lease, scripting=True),
            "celery_singleton_lock",
            "celery-singleton-lock",
            "RedisLock(client, name, timeout=lease)",
        ),
        Contender(
            "csl-plain",
            lambda c, k, lease: CslLock(c, k, lease, scripting=False),
            "celery_singleton_lock",
            "celery-singleton-lock",
            "RedisLock(client, name, timeout=lease, scripting=False)",
        ),
        Contender(
            "redis-py",
            lambda c, k, lease: RedisPyLock(c, k, lease, sleep=0.1),
            "redis.lock",
            "redis",
            "client.lock(name, timeout=lease)  (sleep=0.1 default)",
        ),
        Contender(
            "redis-py sleep=0.001",
            lambda c, k, lease: RedisPyLock(c, k, lease, sleep=0.001),
            "redis.lock",
            "redis",
            "client.lock(name, timeout=lease, sleep=0.001)",
            heavy=True,
        ),
        Contender(
            "python-redis-lock",
            PythonRedisLock,
            "redis_lock",
            "python-redis-lock",
            "redis_lock.Lock(client, name, expire=lease)",
        ),
        Contender(
            "pottery",
            PotteryRedlock,
            "pottery",
            "pottery",
            "Redlock(key=name, masters={client}, auto_release_time=lease)",
        ),
        Contender(
            "floor",
            FloorLock,
            "redis",
            "redis",
            "SET NX PX + Lua compare-and-delete, busy spin when taken",
            heavy=True,
        ),
    )
}


#: ``fair_after`` in ms of scenario B's eventual-fairness variants of ours (issue 24).
FAIR_MS: dict[str, float] = {f"csl fair_after={ms:g}ms": ms for ms in (1.0, 5.0, 20.0)}


def _fair(ms: float) -> Factory:
    return lambda c, k, lease: CslLock(c, k, lease, scripting=True, fair_after=ms / 1000)


#: Ours with ``fair_after`` set: measured in scenario B only (the other scenarios have at
#: most one waiter, where fair_after changes nothing).
FAIR_CONTENDERS: dict[str, Contender] = {
    name: Contender(
        name,
        _fair(ms),
        "celery_singleton_lock",
        "celery-singleton-lock",
        f"RedisLock(client, name, timeout=lease, fair_after={ms / 1000:g})",
    )
    for name, ms in FAIR_MS.items()
}
