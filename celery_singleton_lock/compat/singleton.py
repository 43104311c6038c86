"""celery-singleton's API on this package's engine: change the import, keep the code.

::

    from celery_singleton_lock.compat.singleton import Singleton, DuplicateTaskError, clear_locks

    @app.task(base=Singleton, unique_on=["user_id"], raise_on_duplicate=False, lock_expiry=None)
    def sync_user(user_id, full=False): ...

The lock is taken in ``apply_async``/``delay`` on the task name and its arguments (bound
to the signature, or only the ``unique_on`` parameters). A duplicate call publishes nothing
and returns the queued or running task's ``AsyncResult``, or raises ``DuplicateTaskError``
with ``raise_on_duplicate``. The lock is released when the run ends, success or failure.
``task.apply()`` publishes nothing and takes no lock: the body runs, even while the same call
is queued. With the lock Redis unreachable, ``delay`` raises ``LockConnectionError``: our
``LockBackendError``, and also redis-py's ``ConnectionError``, as celery-singleton raised.

Settings, each also written upper case or as ``CELERY_SINGLETON_...``:
``singleton_backend_url`` (default: the result backend if it is Redis, else the broker),
``singleton_key_prefix`` (``SINGLETONLOCK_``), ``singleton_raise_on_duplicate`` (False),
``singleton_lock_expiry`` (None: never). ``singleton_backend_class`` may only name
celery-singleton's own Redis backend and ``singleton_backend_kwargs`` must be empty: the
locks live in this package's engine, so a custom backend is refused at first use (and at
worker start) instead of being silently ignored.

Without an expiry, a lock is still never held for ever: while the task runs its lease
(``singleton_lock_timeout``, 30 s) is renewed, so a lost worker frees it within one lease;
while the message waits in the queue it holds a lease of :data:`QUEUED_LEASE`.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Any, ClassVar

from celery.exceptions import ImproperlyConfigured

from celery_singleton_lock.client import redis_for
from celery_singleton_lock.compat._common import (
    CompatTask,
    check_keys,
    conf_value,
    parse_setting,
    redis_url,
    setting_spellings,
)
from celery_singleton_lock.config import settings_for
from celery_singleton_lock.exceptions import SingletonLockError, TaskLocked
from celery_singleton_lock.ops.admin import delete_locks, prefix_pattern, read_locks
from celery_singleton_lock.runtime import FOREIGN_ALLOWED

if TYPE_CHECKING:
    from celery import Celery
    from celery.result import AsyncResult

    from celery_singleton_lock.options import Settings

__all__ = [
    "DEFAULT_KEY_PREFIX",
    "QUEUED_LEASE",
    "CelerySingletonException",
    "DuplicateTaskError",
    "Singleton",
    "clear_locks",
    "lock_store",
]

#: ``singleton_key_prefix`` when unset, as in celery-singleton.
DEFAULT_KEY_PREFIX = "SINGLETONLOCK_"
#: Seconds a lock taken at publish lasts while its message waits in the queue, when no
#: ``lock_expiry`` is set (nobody can renew a lease there). ``lock_queue_timeout`` on the
#: task overrides it.
QUEUED_LEASE = 86400.0
#: celery-singleton's own backend, the one value ``singleton_backend_class`` may name.
_REDIS_BACKENDS = frozenset(
    {"celery_singleton.backends.redis.RedisBackend", "celery_singleton.backends.RedisBackend"}
)
#: Result-backend schemes whose server also holds the locks.
_REDIS_SCHEMES = ("redis://", "rediss://")
#: A key of celery-singleton itself: the prefix and an MD5 digest.
_LEGACY_DIGEST = "[0-9a-f]{32}"


class CelerySingletonException(SingletonLockError):
    """Root of celery-singleton's exceptions, under this package's root."""


class DuplicateTaskError(CelerySingletonException, TaskLocked):
    """A duplicate call under ``raise_on_duplicate``: ``task_id`` is the queued or running
    task's id, ``key`` the lock's Redis key. Also a ``TaskLocked``."""

    def __init__(self, message: str, task_id: str | None, key: str = "") -> None:
        TaskLocked.__init__(self, key, task_id, message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.message, self.task_id, self.key))


def _flag(value: Any, where: str) -> bool | None:
    """A bool, or None for "not set"."""
    if value is None or isinstance(value, bool):
        return value
    raise ImproperlyConfigured(f"{where} must be True or False, got {value!r}")


def _expiry(value: Any, where: str) -> float | None:
    """Seconds of ``lock_expiry``, or None for "never"."""
    if value is None:
        return None
    number: float = parse_setting("timeout", value, where)
    return number


def _check_backend(conf: Any) -> None:
    """Refuse a custom storage backend: the locks live in this package's engine."""
    spelled, backend = conf_value(conf, setting_spellings("singleton_backend_class"))
    if backend is not None:
        name = (
            backend
            if isinstance(backend, str)
            else (f"{getattr(backend, '__module__', '')}.{getattr(backend, '__qualname__', '')}")
        )
        if name not in _REDIS_BACKENDS:
            raise ImproperlyConfigured(
                f"{spelled}: custom celery-singleton backends are not supported, got "
                f"{name!r}: the locks live in celery-singleton-lock's Redis engine (remove "
                "the setting, see docs/migration.md)"
            )
    spelled, kwargs = conf_value(conf, setting_spellings("singleton_backend_kwargs"))
    if kwargs:
        raise ImproperlyConfigured(
            f"{spelled}: backend keyword arguments are not supported, got {sorted(kwargs)!r}: "
            "give connection options in singleton_backend_url's query string instead "
            "(e.g. ?socket_timeout=5&ssl_cert_reqs=none)"
        )


def lock_store(app: Celery) -> tuple[str, str]:
    """``(Redis URL, key prefix)`` where ``app``'s celery-singleton locks live (to point
    ``celery locks list`` or a Redis client at them)."""
    url, prefix, _ = _store(app, settings_for(app))
    return url, prefix


def _store(app: Celery, settings: Settings) -> tuple[str, str, str]:
    """``(Redis URL, key prefix, where the URL came from)`` of ``app``'s celery-singleton
    locks: the URL from
    ``singleton_backend_url``, else our ``singleton_lock_url`` when set, else the result
    backend when it is Redis, else the broker."""
    conf = app.conf
    _check_backend(conf)
    spelled, url = conf_value(conf, setting_spellings("singleton_backend_url"))
    origin = str(spelled)
    if url is not None:
        url = redis_url(url, origin)
    elif settings.url_origin not in ("broker_url", "result_backend", "default"):
        url, origin = settings.url, settings.url_origin
    else:
        backend = getattr(conf, "result_backend", None)
        if isinstance(backend, str) and backend.lower().startswith(_REDIS_SCHEMES):
            url, origin = backend, "result_backend"
        else:
            origin = "broker_url"
            broker = getattr(conf, "broker_url", None)
            if isinstance(broker, (list, tuple)):
                broker = broker[0] if broker else None
            if isinstance(broker, str):
                broker = broker.split(";", 1)[0].strip()
            url = redis_url(
                broker,
                "singleton_backend_url is not set, the result backend is not Redis, and broker_url",
            )
    spelled, prefix = conf_value(conf, setting_spellings("singleton_key_prefix"))
    if prefix is None:
        return url, DEFAULT_KEY_PREFIX, origin
    return url, parse_setting("prefix", prefix, str(spelled)), origin


class Singleton(CompatTask):
    """celery-singleton's base class: ``@app.task(base=Singleton, unique_on=...,
    raise_on_duplicate=..., lock_expiry=...)``.

    ``unique_on``: parameter names (a list, or one name as a string) that identify the
    work; None or empty: every argument. ``raise_on_duplicate``: raise
    ``DuplicateTaskError`` instead of returning the existing ``AsyncResult`` (None: the
    ``singleton_raise_on_duplicate`` setting). ``lock_expiry``: seconds after which the lock
    goes even if the task still runs (None: the ``singleton_lock_expiry`` setting, else
    never).
    """

    unique_on: ClassVar[str | list[str] | tuple[str, ...] | None] = None
    raise_on_duplicate: ClassVar[bool | None] = None
    lock_expiry: ClassVar[float | None] = None

    compat_foreign_lock_names = frozenset({"lock_expiry"})
    compat_keys_option = "unique_on"

    def compat_adapt(self, settings: Settings) -> tuple[Settings, dict[str, Any]]:
        """Where the locks live, and the options ``unique_on`` and ``lock_expiry`` map to."""
        url, prefix, origin = _store(self.app, settings)
        adapted = dataclasses.replace(settings, url=url, prefix=prefix, url_origin=origin)
        mapped: dict[str, Any] = {"lock_scope": "queue", "lock_on_conflict": "skip"}
        keys = self._unique_on()
        if keys is not None:
            check_keys(self, keys, "unique_on")
            mapped["lock_keys"] = keys
        expiry = self._lock_expiry()
        if expiry is None:
            mapped["lock_queue_timeout"] = QUEUED_LEASE
        else:
            mapped.update(lock_timeout=expiry, lock_queue_timeout=expiry, lock_renew=False)
        self._raise_on_duplicate()  # a bad value is reported now, not at the first duplicate
        return adapted, mapped

    def compat_duplicate(
        self, holder_id: str | None, key: str, result: AsyncResult[Any] | None, given: Any
    ) -> Any:
        """The existing task's AsyncResult, or ``DuplicateTaskError`` when asked to raise."""
        if self._raise_on_duplicate():
            raise DuplicateTaskError(
                f"Attempted to queue a duplicate of task ID {holder_id}", task_id=holder_id, key=key
            )
        if result is not None:
            return result
        if holder_id is not None:
            return self.AsyncResult(holder_id)
        raise TaskLocked(key, None, f"lock {key!r} is held by something that is not a task")

    def _unique_on(self) -> tuple[str, ...] | None:
        value = self.unique_on
        if not value:
            return None
        if isinstance(value, str):
            return (value,)
        if isinstance(value, (list, tuple)) and all(isinstance(name, str) for name in value):
            return tuple(value)
        raise ImproperlyConfigured(
            f"task {self.name!r}: unique_on must be a parameter name or a list of them, "
            f"got {value!r}"
        )

    def _lock_expiry(self) -> float | None:
        if self.lock_expiry is not None:
            return _expiry(self.lock_expiry, f"task {self.name!r}: lock_expiry")
        spelled, value = conf_value(self.app.conf, setting_spellings("singleton_lock_expiry"))
        return _expiry(value, str(spelled))

    def _raise_on_duplicate(self) -> bool:
        own = _flag(self.raise_on_duplicate, f"task {self.name!r}: raise_on_duplicate")
        if own is not None:
            return own
        spelled, value = conf_value(
            self.app.conf, setting_spellings("singleton_raise_on_duplicate")
        )
        return bool(_flag(value, str(spelled)))


setattr(Singleton, FOREIGN_ALLOWED, ("unique_on", "raise_on_duplicate", "lock_expiry"))


def clear_locks(app: Celery) -> int:
    """Remove every celery-singleton lock of ``app`` (call it from ``worker_ready`` to start
    clean); returns how many went.

    That is this package's locks under ``singleton_key_prefix`` on the singleton lock
    Redis, and keys that celery-singleton itself left there (the prefix and an MD5 digest).
    Nothing else under the prefix, and nothing outside it, is touched.
    """
    url, prefix = lock_store(app)
    client = redis_for(app, url)
    ours = f"{prefix}:"
    legacy = re.compile(re.escape(prefix) + _LEGACY_DIGEST)
    rows = read_locks(client, prefix_pattern(prefix).removesuffix(":*") + "*")
    locks = [row.key for row in rows if row.kind == "lock" and row.key.startswith(ours)]
    left = [row.key for row in rows if row.kind == "foreign" and legacy.fullmatch(row.key)]
    cleared = delete_locks(client, locks)
    if left:
        cleared += int(client.delete(*left))
    return cleared
