"""One frozen, validated settings object per Celery app, and per-task lock options.

Settings are read from ``app.conf`` under flat lowercase names (``singleton_lock_url``,
``singleton_lock_timeout``, …), built once per app on first use and cached on that app
object, so two apps in one process keep their own settings. Django projects that load
settings with ``app.config_from_object("django.conf:settings", namespace="CELERY")`` write
them as ``CELERY_SINGLETON_LOCK_URL`` etc.; those are found too.

A bad value raises :class:`celery.exceptions.ImproperlyConfigured` naming the setting as
the user wrote it, when the settings are built (worker start or first use), never later.

Defaults: prefix ``"csl"``, lease ``30`` seconds, ``on_conflict="skip"``, ``scope="run"``,
renewal on, waits of at most ``60`` seconds, automatic retry delay, fail closed, scripting
on, and the URL of the broker (or else the result backend) when it is a Redis one.
"""

from __future__ import annotations

import contextlib
import difflib
import fnmatch
import math
import numbers
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from celery.exceptions import ImproperlyConfigured

if TYPE_CHECKING:
    from celery import Celery

__all__ = [
    "CONFLICT_POLICIES",
    "DEFAULT_PREFIX",
    "DEFAULT_TIMEOUT",
    "DEFAULT_URL",
    "DEFAULT_WAIT",
    "REDIS_URL_SCHEMES",
    "SCOPES",
    "TASK_OPTIONS",
    "LockOptions",
    "Settings",
    "clear_settings",
    "settings_for",
    "validate_task_options",
]

CONFLICT_POLICIES = ("skip", "wait", "retry", "raise")
SCOPES = ("run", "queue")
DEFAULT_PREFIX = "csl"
DEFAULT_TIMEOUT = 30.0
DEFAULT_WAIT = 60.0
#: Lease of a queue-scope lock while its message waits in the queue (nobody renews it).
DEFAULT_QUEUE_TIMEOUT = 3600.0
DEFAULT_URL = "redis://localhost:6379/0"
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
#: Result-backend schemes that are borrowed as the lock's Redis.
_BACKEND_SCHEMES = ("redis", "rediss")
#: The per-task option names, as class attributes and in ``singleton_lock_tasks`` entries.
TASK_OPTIONS = (
    "lock_keys",
    "lock_timeout",
    "lock_renew",
    "lock_on_conflict",
    "lock_scope",
    "lock_wait",
    "lock_retry_delay",
    "lock_queue_timeout",
)

KeysOption = tuple[str, ...] | Callable[[tuple[Any, ...], dict[str, Any]], Any] | None

_MISSING: Any = object()


# ------------------------------------------------------------------------- values


def _is_number(value: object) -> bool:
    """A real number that is not a bool (``True`` is an int, but never a duration)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _duration(
    value: object, where: str, *, positive: bool, allow_none: bool, inf_is_none: bool = False
) -> float | None:
    """A finite number of seconds (> 0, or >= 0); ``None`` where allowed, and ``math.inf``
    read as None where ``inf_is_none`` (a wait without limit)."""
    if value is None and allow_none:
        return None
    if _is_number(value):
        number = float(value)  # type: ignore[arg-type]
        if inf_is_none and number == math.inf:
            return None
        if math.isfinite(number) and (number > 0 if positive else number >= 0):
            return number
    bound = "a finite number > 0" if positive else "a number >= 0"
    extra = " or None" if allow_none else ""
    raise ImproperlyConfigured(f"{where} must be {bound}{extra}, got {value!r}")


def _flag(value: object, where: str) -> bool:
    """A real bool: strings like ``"false"`` are truthy, so they are refused."""
    if isinstance(value, bool):
        return value
    raise ImproperlyConfigured(f"{where} must be True or False, got {value!r}")


def _choice(value: object, where: str, choices: tuple[str, ...]) -> str:
    """One of ``choices``, exactly."""
    if isinstance(value, str) and value in choices:
        return value
    allowed = ", ".join(repr(choice) for choice in choices)
    raise ImproperlyConfigured(f"{where} must be one of {allowed}, got {value!r}")


def _keys(value: object, where: str) -> KeysOption:
    """``None``, a callable, or a list/tuple of parameter names (returned as a tuple).

    Whether the names exist is checked against the task's signature by the task layer
    (:func:`celery_singleton_lock.keys.check_lock_keys`), which knows the function.
    """
    if value is None:
        return None
    if callable(value):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(name, str) for name in value):
        return tuple(value)
    hint = " (wrap a single name in a list: ['name'])" if isinstance(value, str) else ""
    raise ImproperlyConfigured(
        f"{where} must be None, a callable (args, kwargs) -> str, or a list/tuple of "
        f"parameter names, got {value!r}{hint}"
    )


def _url(value: object, where: str) -> str:
    """A Redis URL: a string whose scheme the lock's Redis client understands."""
    if isinstance(value, str) and _scheme(value) in REDIS_URL_SCHEMES:
        return value
    schemes = ", ".join(f"{scheme}://" for scheme in REDIS_URL_SCHEMES)
    raise ImproperlyConfigured(f"{where} must be a Redis URL ({schemes}), got {_masked(value)!r}")


def _prefix(value: object, where: str) -> str:
    """A non-empty key prefix without braces (a brace would move the Cluster hash tag)
    or whitespace."""
    if (
        isinstance(value, str)
        and value
        and not any(ch in "{}" or ch.isspace() or not ch.isprintable() for ch in value)
    ):
        return value
    raise ImproperlyConfigured(
        f"{where} must be a non-empty string without braces or whitespace, got {value!r}"
    )


def _scheme(url: str) -> str:
    """The lowercased scheme of a URL, ``""`` when it has none."""
    head, sep, _ = url.partition("://")
    return head.strip().lower() if sep else ""


def _masked(value: object) -> object:
    """A URL with its password hidden, for error messages (other values unchanged)."""
    if not isinstance(value, str):
        return value
    try:
        parts = urlsplit(value)
        if parts.password:
            netloc = parts.netloc.replace(f":{parts.password}@", ":**@", 1)
            return parts._replace(netloc=netloc).geturl()
    except ValueError:
        return "<unparsable URL>"
    return value


# ------------------------------------------------------------------ task options


def validate_task_options(options: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Validate per-task ``lock_*`` options; return them normalised.

    ``where`` prefixes every message, e.g. ``"singleton_lock_tasks['billing.*']"`` or
    ``"task 'shop.buy'"``. An unknown name (a typo such as ``lock_timout``) is an error.
    ``None`` means "not set" for ``lock_timeout``, ``lock_queue_timeout``,
    ``lock_renew``, ``lock_on_conflict`` and ``lock_scope`` (dropped from the result); for
    ``lock_keys`` it means every argument, for ``lock_wait`` wait forever and for
    ``lock_retry_delay`` automatic. ``lock_keys`` lists become tuples;
    ``lock_wait=math.inf`` becomes None.
    """
    if not isinstance(options, Mapping):
        raise ImproperlyConfigured(f"{where} must be a mapping of lock_* options, got {options!r}")
    result: dict[str, Any] = {}
    for name, value in options.items():
        if name not in TASK_OPTIONS:
            close = difflib.get_close_matches(str(name), TASK_OPTIONS, n=1)
            hint = f"did you mean {close[0]!r}?" if close else "known: " + ", ".join(TASK_OPTIONS)
            raise ImproperlyConfigured(f"{where}: unknown option {name!r} ({hint})")
        label = f"{where}: {name}"
        if name == "lock_keys":
            result[name] = _keys(value, label)
        elif name == "lock_wait":
            result[name] = _duration(
                value, label, positive=False, allow_none=True, inf_is_none=True
            )
        elif name == "lock_retry_delay":
            result[name] = _duration(value, label, positive=False, allow_none=True)
        elif value is None:
            continue
        elif name in ("lock_timeout", "lock_queue_timeout"):
            result[name] = _duration(value, label, positive=True, allow_none=False)
        elif name == "lock_renew":
            result[name] = _flag(value, label)
        elif name == "lock_on_conflict":
            result[name] = _choice(value, label, CONFLICT_POLICIES)
        else:  # lock_scope
            result[name] = _choice(value, label, SCOPES)
    return result


@dataclass(frozen=True)
class LockOptions:
    """The effective lock options of one task (task attributes > config glob > settings).

    ``wait=None`` waits forever; ``retry_delay=None`` lets the task layer pick a countdown
    from the holder's remaining lease plus jitter.
    """

    keys: KeysOption
    timeout: float
    renew: bool
    on_conflict: str
    scope: str
    wait: float | None
    retry_delay: float | None
    queue_timeout: float = DEFAULT_QUEUE_TIMEOUT


# ---------------------------------------------------------------------- settings


def _finalize(conf: Mapping[str, Any]) -> None:
    """Make a lazy Celery configuration load itself.

    Until one of its keys is read, ``app.conf`` is a placeholder without the namespace or
    the loaded maps that :func:`_lookup` inspects.
    """
    with contextlib.suppress(Exception):
        conf.get("broker_url")


def _spellings(conf: Mapping[str, Any], name: str) -> list[str]:
    """The names a setting may be written under: ``singleton_lock_x``,
    ``SINGLETON_LOCK_X``, ``CELERY_SINGLETON_LOCK_X`` and, when Celery was configured
    with another namespace, ``<NAMESPACE>_SINGLETON_LOCK_X``."""
    upper = name.upper()
    names = [name, upper, f"CELERY_{upper}"]
    prefix = conf.__dict__.get("prefix") if hasattr(conf, "__dict__") else None
    if isinstance(prefix, str) and prefix:
        spelled = f"{prefix.upper()}{upper}" if prefix.isupper() else f"{prefix}{name}"
        if spelled not in names:
            names.insert(1, spelled)
    return names


def _written(conf: Mapping[str, Any], key: str) -> Any:
    """The value stored under exactly ``key``, or ``_MISSING``.

    Celery's configuration view also answers ``conf["x"]`` with ``CELERY_X`` when it has a
    namespace; its underlying maps are read one by one so that the message of an error
    can name the spelling the user actually wrote.
    """
    maps = getattr(conf, "maps", None)
    if isinstance(maps, list):
        for mapping in maps:
            try:
                return mapping[key]
            except (KeyError, AttributeError, TypeError):
                continue
        return _MISSING
    try:
        return conf[key]
    except (KeyError, AttributeError, TypeError):
        return _MISSING


def _lookup(conf: Mapping[str, Any], name: str) -> tuple[str, Any]:
    """``(name as written, value)`` of one setting, ``(name, _MISSING)`` when unset."""
    for spelled in _spellings(conf, name):
        value = _written(conf, spelled)
        if value is not _MISSING:
            return spelled, value
    try:  # whatever else Celery's own key resolution knows about
        return name, conf[name]
    except (KeyError, AttributeError, TypeError):
        return name, _MISSING


def _setting(conf: Mapping[str, Any], key: str) -> Any:
    """A Celery setting such as ``broker_url``, honouring the ``CELERY_BROKER_URL``
    environment variable the way ``app.conf.broker_url`` does."""
    if isinstance(getattr(type(conf), key, None), property):
        return getattr(conf, key)
    return _lookup(conf, key)[1]


def _first_url(value: object) -> str | None:
    """The first URL of a broker setting: a ``;``-separated string or a list of URLs."""
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    if isinstance(value, str) and value.strip():
        return value.split(";", 1)[0].strip()
    return None


def _default_url(conf: Mapping[str, Any]) -> str:
    """The broker URL if it is a Redis one, else the result backend's if Redis, else
    ``redis://localhost:6379/0``."""
    broker = _first_url(_setting(conf, "broker_url"))
    if broker is not None and _scheme(broker) in REDIS_URL_SCHEMES:
        return broker
    backend = _setting(conf, "result_backend")
    if isinstance(backend, str) and _scheme(backend) in _BACKEND_SCHEMES:
        return backend
    return DEFAULT_URL


def _tasks(value: object, where: str) -> tuple[tuple[str, Mapping[str, Any]], ...]:
    """``{glob: {lock_*: value}}`` (or a list of ``(glob, options)`` pairs), in order."""
    if value is None:
        return ()
    if isinstance(value, Mapping):
        pairs = list(value.items())
    elif isinstance(value, (list, tuple)) and all(
        isinstance(pair, (list, tuple)) and len(pair) == 2 for pair in value
    ):
        pairs = [(pair[0], pair[1]) for pair in value]
    else:
        raise ImproperlyConfigured(
            f"{where} must be a mapping of task-name glob to options, "
            f'e.g. {{"billing.*": {{"lock_keys": ["invoice_id"]}}}}, got {value!r}'
        )
    result: list[tuple[str, Mapping[str, Any]]] = []
    for pattern, options in pairs:
        if not isinstance(pattern, str) or not pattern:
            raise ImproperlyConfigured(
                f"{where}: keys must be task-name globs (non-empty str), got {pattern!r}"
            )
        label = f"{where}[{pattern!r}]"
        result.append((pattern, MappingProxyType(validate_task_options(options, label))))
    return tuple(result)


@dataclass(frozen=True)
class Settings:
    """Every ``singleton_lock_*`` setting of one app, validated.

    ``tasks`` keeps the ``singleton_lock_tasks`` entries in the user's order as
    ``(glob, validated options)``; the first glob matching a task name applies.
    """

    url: str = DEFAULT_URL
    prefix: str = DEFAULT_PREFIX
    timeout: float = DEFAULT_TIMEOUT
    on_conflict: str = "skip"
    scope: str = "run"
    renew: bool = True
    wait: float | None = DEFAULT_WAIT
    retry_delay: float | None = None
    queue_timeout: float = DEFAULT_QUEUE_TIMEOUT
    tasks: tuple[tuple[str, Mapping[str, Any]], ...] = ()
    fail_open: bool = False
    scripting: bool = True
    _matches: dict[str, int | None] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @classmethod
    def from_conf(cls, conf: Mapping[str, Any]) -> Settings:
        """Read and validate the settings from ``app.conf`` (or any mapping).

        Raises ``ImproperlyConfigured`` naming the first bad setting.
        """
        _finalize(conf)
        values: dict[str, Any] = {}

        def read(field_name: str) -> tuple[str, Any]:
            return _lookup(conf, f"singleton_lock_{field_name}")

        name, value = read("url")
        values["url"] = _default_url(conf) if value in (_MISSING, None) else _url(value, name)
        name, value = read("prefix")
        if value is not _MISSING:
            values["prefix"] = _prefix(value, name)
        name, value = read("timeout")
        if value is not _MISSING:
            values["timeout"] = _duration(value, name, positive=True, allow_none=False)
        name, value = read("queue_timeout")
        if value is not _MISSING:
            values["queue_timeout"] = _duration(value, name, positive=True, allow_none=False)
        name, value = read("on_conflict")
        if value is not _MISSING:
            values["on_conflict"] = _choice(value, name, CONFLICT_POLICIES)
        name, value = read("scope")
        if value is not _MISSING:
            values["scope"] = _choice(value, name, SCOPES)
        for flag in ("renew", "fail_open", "scripting"):
            name, value = read(flag)
            if value is not _MISSING:
                values[flag] = _flag(value, name)
        for duration in ("wait", "retry_delay"):
            name, value = read(duration)
            if value is not _MISSING:
                values[duration] = _duration(
                    value, name, positive=False, allow_none=True, inf_is_none=duration == "wait"
                )
        name, value = read("tasks")
        if value is not _MISSING:
            values["tasks"] = _tasks(value, name)
        return cls(**values)

    def _matching(self, task_name: str) -> Mapping[str, Any] | None:
        """The options of the first ``tasks`` glob matching ``task_name`` (memoised)."""
        if not self.tasks:
            return None
        try:
            index = self._matches[task_name]
        except KeyError:
            index = next(
                (
                    position
                    for position, (pattern, _) in enumerate(self.tasks)
                    if fnmatch.fnmatchcase(task_name, pattern)
                ),
                None,
            )
            self._matches[task_name] = index
        return None if index is None else self.tasks[index][1]

    def options_for(
        self, task_name: str, overrides: Mapping[str, Any] | None
    ) -> LockOptions | None:
        """The effective options of one task, or None when it is not locked at all.

        ``overrides`` are the task's own explicitly-set ``lock_*`` attributes (None for a
        task that is not a ``LockedTask``); a None value counts as unset except for
        ``lock_keys``, which the caller passes only when set. Precedence: overrides, then
        the first matching ``singleton_lock_tasks`` glob, then these settings.
        """
        matched = self._matching(task_name)
        if overrides is None and matched is None:
            return None
        merged: dict[str, Any] = dict(matched or {})
        if overrides:
            given = {
                name: value
                for name, value in overrides.items()
                if value is not None or name == "lock_keys"
            }
            merged.update(validate_task_options(given, f"task {task_name!r}"))
        return LockOptions(
            keys=merged.get("lock_keys"),
            timeout=merged.get("lock_timeout", self.timeout),
            renew=merged.get("lock_renew", self.renew),
            on_conflict=merged.get("lock_on_conflict", self.on_conflict),
            scope=merged.get("lock_scope", self.scope),
            wait=merged.get("lock_wait", self.wait),
            retry_delay=merged.get("lock_retry_delay", self.retry_delay),
            queue_timeout=merged.get("lock_queue_timeout", self.queue_timeout),
        )


# -------------------------------------------------------------------- per app


_cache_lock = threading.Lock()
_by_app: weakref.WeakKeyDictionary[Celery, Settings] = weakref.WeakKeyDictionary()


def settings_for(app: Celery) -> Settings:
    """The settings of ``app``, built and validated on first use, then cached on that app.

    Thread-safe; each app object keeps its own settings, and they are dropped with it.
    """
    try:
        return _by_app[app]
    except KeyError:
        pass
    with _cache_lock:
        try:
            return _by_app[app]
        except KeyError:
            settings = Settings.from_conf(app.conf)
            _by_app[app] = settings
            return settings


def clear_settings(app: Celery | None = None) -> None:
    """Forget the cached settings of ``app`` (of every app when None), so the next
    :func:`settings_for` reads ``app.conf`` again; for tests and reconfiguration."""
    with _cache_lock:
        if app is None:
            _by_app.clear()
        else:
            _by_app.pop(app, None)
