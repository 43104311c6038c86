"""celery-once's API on this package's engine: change the import, keep the code.

::

    from celery_singleton_lock.compat.once import QueueOnce, AlreadyQueued

    app.conf.ONCE = {
        "backend": "celery_once.backends.Redis",
        "settings": {"url": "redis://localhost:6379/0", "default_timeout": 60 * 60},
    }

    @app.task(base=QueueOnce, once={"keys": ["user_id"], "graceful": False})
    def sync_user(user_id, full=False): ...

``delay``/``apply_async`` take the lock on the task name and its arguments (or the
``once['keys']`` parameters; ``[]``: the task name only) and raise ``AlreadyQueued`` while
it is held, or return a result whose ``.result`` is None with ``graceful``. Calling the task
directly, or running it with ``task.apply()``, is not locked (the body runs even while the
same call is queued, and leaves that call's lock alone). With the lock Redis unreachable,
``delay`` raises ``LockConnectionError``: our ``LockBackendError``, and also redis-py's
``ConnectionError``, as celery-once raised. The lock is released when the run ends, success or
failure, or just before the body runs with ``unlock_before_run``; it expires ``timeout``
seconds (the ``default_timeout``, one hour) after it was taken, and again after the run
started.

``ONCE['backend']`` is recognised by name, never imported (after the migration there is no
``celery_once`` package): it must name celery-once's Redis backend. Its ``settings``:
``url`` (``redis://``, ``rediss://``, ``redis+socket://``; ``?ssl=true`` means TLS, as it did
there), ``default_timeout``, ``blocking`` and ``blocking_timeout`` (wait at publish for a busy
lock before raising). Unknown names in ``ONCE``, ``settings`` and ``once={...}`` are errors
with a suggestion. The keys live under ``singleton_lock_prefix``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from celery import states
from celery.exceptions import ImproperlyConfigured
from celery.result import EagerResult

from celery_singleton_lock import runtime
from celery_singleton_lock.compat._common import (
    CompatTask,
    applied_directly,
    check_keys,
    conf_value,
    parse_setting,
    redis_url,
    unknown_names,
)
from celery_singleton_lock.config import settings_for
from celery_singleton_lock.engine.lock import RedisLock
from celery_singleton_lock.exceptions import LockBackendError, LockNotOwned, TaskLocked
from celery_singleton_lock.runtime import FOREIGN_ALLOWED, PUBLISH_WAIT_OPTION
from celery_singleton_lock.task import LockedTask

if TYPE_CHECKING:
    from celery import Celery
    from celery.result import AsyncResult

    from celery_singleton_lock.options import Settings

__all__ = [
    "DEFAULT_TIMEOUT",
    "DEFAULT_URL",
    "AlreadyQueued",
    "OnceConfig",
    "QueueOnce",
    "once_config",
]

log = logging.getLogger("celery_singleton_lock.compat.once")

#: ``settings['url']`` when unset, as celery-once documents it.
DEFAULT_URL = "redis://localhost:6379/0"
#: ``settings['default_timeout']`` when unset: one hour.
DEFAULT_TIMEOUT = 3600.0
#: ``settings['blocking_timeout']`` when unset.
DEFAULT_BLOCKING_TIMEOUT = 1.0
#: The configuration's own names.
CONFIG_SPELLINGS = ("ONCE", "once", "CELERY_ONCE")
#: The values of ``ONCE['backend']`` that name celery-once's Redis backend.
REDIS_BACKENDS = frozenset({"celery_once.backends.Redis", "celery_once.backends.redis.Redis"})
_FILE_BACKENDS = frozenset({"celery_once.backends.File", "celery_once.backends.file.File"})
_CONFIG_KEYS = ("backend", "settings")
_SETTINGS_KEYS = ("url", "default_timeout", "blocking", "blocking_timeout")
#: ``once={...}`` on the task, and the part of it a single call may change.
_TASK_KEYS = ("graceful", "timeout", "keys", "unlock_before_run")
_CALL_KEYS = ("graceful", "timeout")
_TRUE = frozenset({"1", "true", "yes", "on"})


class AlreadyQueued(TaskLocked):
    """The task is already queued or running with these arguments: ``countdown`` is the
    number of seconds until its lock expires, ``message`` says so. Also a ``TaskLocked``
    (``key`` is the lock's Redis key, ``task_id`` the holder's id when known)."""

    def __init__(self, countdown: float, key: str = "", task_id: str | None = None) -> None:
        super().__init__(key, task_id, f"Expires in {countdown} seconds")
        self.countdown = countdown

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.countdown, self.key, self.task_id))


@dataclass(frozen=True)
class OnceConfig:
    """``app.conf.ONCE``, checked: the lock Redis, the default lease, and how long a publish
    waits for a busy lock (0: it does not wait; None: no limit)."""

    url: str
    default_timeout: float
    wait: float | None
    spelled: str = "ONCE"


def _flag(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    raise ImproperlyConfigured(f"{where} must be True or False, got {value!r}")


def _once_url(value: Any, where: str) -> str:
    """celery-once's URL forms as a URL of ours: ``redis://…?ssl=true`` is TLS (celery-once
    handed ``ssl`` to the client as is), so it becomes ``rediss://``."""
    url = redis_url(value, where)
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    ssl = [item for item in query if item[0].lower() == "ssl"]
    if not ssl:
        return url
    rest = urlencode([item for item in query if item[0].lower() != "ssl"])
    scheme = parts.scheme
    if scheme.lower() == "redis" and ssl[-1][1].lower() in _TRUE:
        scheme = "rediss"
    return urlunsplit((scheme, parts.netloc, parts.path, rest, parts.fragment))


def once_config(app: Celery) -> OnceConfig:
    """Read and check ``app.conf.ONCE`` (also written ``once`` or ``CELERY_ONCE``)."""
    spelled, once = conf_value(app.conf, CONFIG_SPELLINGS)
    if once is None:
        raise ImproperlyConfigured(
            "QueueOnce tasks need app.conf.ONCE = {'backend': 'celery_once.backends.Redis', "
            "'settings': {'url': 'redis://...', 'default_timeout': 3600}}"
        )
    where = str(spelled)
    if not isinstance(once, Mapping):
        raise ImproperlyConfigured(f"{where} must be a mapping, got {once!r}")
    unknown_names(once, _CONFIG_KEYS, where)
    backend = once.get("backend")
    if backend not in REDIS_BACKENDS:
        why = (
            "celery-once's file backend is not supported"
            if backend in _FILE_BACKENDS
            else "custom celery-once backends are not supported"
        )
        raise ImproperlyConfigured(
            f"{where}['backend']: {why}, got {backend!r}: the locks live in "
            "celery-singleton-lock's Redis engine; use 'celery_once.backends.Redis' with a "
            "Redis URL (see docs/migration.md)"
        )
    settings = once.get("settings") or {}
    if not isinstance(settings, Mapping):
        raise ImproperlyConfigured(f"{where}['settings'] must be a mapping, got {settings!r}")
    inner = f"{where}['settings']"
    unknown_names(settings, _SETTINGS_KEYS, inner)
    url = _once_url(settings.get("url", DEFAULT_URL), f"{inner}['url']")
    timeout: float = parse_setting(
        "queue_timeout",
        settings.get("default_timeout", DEFAULT_TIMEOUT),
        f"{inner}['default_timeout']",
    )
    wait: float | None = 0.0
    if _flag(settings.get("blocking", False), f"{inner}['blocking']"):
        limit = settings.get("blocking_timeout", DEFAULT_BLOCKING_TIMEOUT)
        wait = (
            None if limit is None else parse_setting("wait", limit, f"{inner}['blocking_timeout']")
        )
    return OnceConfig(url, timeout, wait, where)


class QueueOnce(CompatTask):
    """celery-once's base class: ``@app.task(base=QueueOnce, once={...})``.

    ``once``: ``graceful`` (return a result whose ``.result`` is None instead of raising
    ``AlreadyQueued``), ``timeout`` (seconds; default ``ONCE['settings']['default_timeout']``),
    ``keys`` (the parameters that identify the work; ``[]``: the task name only) and
    ``unlock_before_run`` (give the lock up just before the body runs). A call may pass
    ``once={'graceful': ..., 'timeout': ...}`` to ``apply_async``.
    """

    once: ClassVar[Mapping[str, Any]] = MappingProxyType(
        {"graceful": False, "unlock_before_run": False}
    )

    compat_keys_option = "once['keys']"
    compat_call_option = "once"

    def compat_adapt(self, settings: Settings) -> tuple[Settings, dict[str, Any]]:
        """The lock Redis from ``ONCE``, and the options ``once`` maps to."""
        config = self._config()
        once = self._once()
        where = f"task {self.name!r}: once"
        timeout = config.default_timeout
        if once.get("timeout") is not None:
            timeout = parse_setting("queue_timeout", once["timeout"], f"{where}['timeout']")
        mapped: dict[str, Any] = {
            "lock_scope": "queue",
            "lock_on_conflict": "skip",
            "lock_timeout": timeout,
            "lock_queue_timeout": timeout,
            "lock_renew": False,
        }
        keys = once.get("keys")
        if keys is not None:
            if not isinstance(keys, (list, tuple)) or not all(isinstance(k, str) for k in keys):
                raise ImproperlyConfigured(
                    f"{where}['keys'] must be a list of parameter names, got {keys!r}"
                )
            check_keys(self, tuple(keys), "once['keys']")
            mapped["lock_keys"] = tuple(keys)
        _flag(once.get("graceful", False), f"{where}['graceful']")
        _flag(once.get("unlock_before_run", False), f"{where}['unlock_before_run']")
        adapted = dataclasses.replace(settings, url=config.url, url_origin=config.spelled)
        return adapted, mapped

    def compat_call_options(self, given: Any) -> dict[str, Any]:
        """``once={'timeout': N}`` of one call as its lease; the publish wait of ``blocking``."""
        options: dict[str, Any] = {}
        wait = self._config().wait
        if wait != 0:
            options[PUBLISH_WAIT_OPTION] = wait
        call = self._call_once(given)
        if call.get("timeout") is not None:
            timeout = parse_setting("queue_timeout", call["timeout"], "apply_async once['timeout']")
            options.update(lock_timeout=timeout, lock_queue_timeout=timeout)
        return options

    def compat_duplicate(
        self, holder_id: str | None, key: str, result: AsyncResult[Any] | None, given: Any
    ) -> Any:
        """``AlreadyQueued``, or with ``graceful`` a rejected result whose ``.result`` is
        None (what celery-once returns)."""
        call = self._call_once(given)
        graceful = call.get("graceful", self._once().get("graceful", False))
        if _flag(graceful, f"task {self.name!r}: once['graceful']"):
            return EagerResult(None, None, states.REJECTED)  # type: ignore[arg-type]
        raise AlreadyQueued(self._countdown(key), key=key, task_id=holder_id)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self._once().get("unlock_before_run", False) or applied_directly(self.request):
            return super().__call__(*args, **kwargs)
        request = self.request
        if request.id and not request.called_directly:
            self._give_up_queued_lock(request, args, kwargs)
        # The next __call__ past the locking classes (a base class's own, or Celery's).
        body = runtime.body_of(self, super(LockedTask, self).__call__)
        return body(*args, **kwargs)

    def _config(self) -> OnceConfig:
        """``ONCE``, read once per task and app settings (like the runtime's own cache)."""
        settings = settings_for(self.app)
        cached = self.__dict__.get("_once_config")
        if cached is not None and cached[0] is settings:
            config: OnceConfig = cached[1]
            return config
        config = once_config(self.app)
        self.__dict__["_once_config"] = (settings, config)
        return config

    def _once(self) -> Mapping[str, Any]:
        once = self.once
        if not isinstance(once, Mapping):
            raise ImproperlyConfigured(f"task {self.name!r}: once must be a dict, got {once!r}")
        unknown_names(once, _TASK_KEYS, f"task {self.name!r}: once")
        return once

    def _call_once(self, given: Any) -> Mapping[str, Any]:
        if given is None:
            return {}
        where = f"apply_async of task {self.name!r}: once"
        if not isinstance(given, Mapping):
            raise ImproperlyConfigured(f"{where} must be a dict, got {given!r}")
        for name in given:
            if name in _TASK_KEYS and name not in _CALL_KEYS:
                raise ImproperlyConfigured(
                    f"{where}: {name!r} can only be set where the task is defined"
                )
        unknown_names(given, _CALL_KEYS, where)
        return given

    def _countdown(self, key: str) -> float:
        """Seconds until the holder's lease of ``key`` ends (0 when it is already free)."""
        locking = runtime.locking_for(self)
        if locking is None:
            return 0.0
        lock = RedisLock(locking.client(self.app), key, scripting=locking.settings.scripting)
        holder = lock.holder()
        if holder is None or holder.remaining_ms is None:
            return 0.0
        return holder.remaining_ms / 1000

    def _give_up_queued_lock(self, request: Any, args: Any, kwargs: Any) -> None:
        """``unlock_before_run``: release the lock this message took at publish (only that
        hold: a lock someone else took meanwhile is left alone)."""
        locking = runtime.locking_for(self)
        if locking is None:
            return
        key = runtime.header_key(request) or locking.key(
            args, kwargs, received=not request.is_eager
        )
        token = runtime.queue_token(str(request.id))
        lock = RedisLock(
            locking.client(self.app), key, token=token, scripting=locking.settings.scripting
        )
        try:
            lock.release()
        except LockNotOwned:
            log.info(
                "%s[%s]: its lock %s was no longer held before the run", self.name, request.id, key
            )
        except LockBackendError as exc:
            log.error(
                "%s[%s]: could not release lock %s before the run: %s",
                self.name,
                request.id,
                key,
                exc,
            )


setattr(QueueOnce, FOREIGN_ALLOWED, ("once",))
