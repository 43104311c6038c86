"""Reading an app's ``singleton_lock_*`` settings: once per app, validated, never guessed.

The settings themselves (names, defaults, checks) are the table in :mod:`.options`; this
module finds them in ``app.conf`` under any spelling Celery users write (``singleton_lock_x``,
``SINGLETON_LOCK_X``, Django's ``CELERY_SINGLETON_LOCK_X`` or another namespace's prefix),
refuses unknown names with a suggestion, derives the lock URL, and caches the result on the
app object so two apps in one process keep their own settings.
"""

from __future__ import annotations

import dataclasses
import re
import threading
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from celery.exceptions import ImproperlyConfigured

from celery_singleton_lock.client import REDIS_URL_SCHEMES, mask_url, url_scheme
from celery_singleton_lock.options import (
    SETTING_PREFIX,
    TASK_OPTION_PREFIX,
    Settings,
    did_you_mean,
    setting_fields,
    setting_names,
    task_option_names,
)

if TYPE_CHECKING:
    from celery import Celery

__all__ = [
    "DEFAULT_URL",
    "EX_CONFIG",
    "FOREIGN_SETTINGS",
    "clear_settings",
    "derived_url",
    "hide_password",
    "read_settings",
    "settings_for",
    "task_globs",
]

DEFAULT_URL = "redis://localhost:6379/0"
#: sysexits.h "configuration error": the exit status of a process refused for a bad setting
#: (``celery worker``, ``celery beat``, ``celery locks check``), defined once here.
EX_CONFIG = 78
#: Result-backend schemes that are borrowed as the lock's Redis.
_BACKEND_SCHEMES = ("redis", "rediss")
#: Settings that share our prefix but belong to someone else, so they are not typos.
FOREIGN_SETTINGS = {
    "singleton_lock_expiry": "celery-singleton's lock lifetime, read by its compat module",
}


def _namespace(conf: Mapping[str, Any]) -> str:
    """The lowercased prefix Celery was configured with (``config_from_object(...,
    namespace="CELERY")`` gives ``"celery_"``), or ``""``."""
    prefix = vars(conf).get("prefix") if hasattr(conf, "__dict__") else None
    return prefix.lower() if isinstance(prefix, str) else ""


def _written(conf: Mapping[str, Any]) -> dict[str, tuple[str, Any]]:
    """Every setting of ours in ``conf``: canonical name -> (name as written, value).

    A key counts as ours when, lowercased and without a ``celery_`` (or the configured
    namespace) head, it starts with ``singleton_lock_``. The lowercase spelling wins when a
    setting is written twice.
    """
    return written_settings(conf, SETTING_PREFIX)


def written_settings(conf: Mapping[str, Any], prefix: str) -> dict[str, tuple[str, Any]]:
    """Every setting in ``conf`` whose name, lowercased and without a ``celery_`` (or the
    configured namespace) head, starts with ``prefix``: canonical name -> (name as written,
    value). The lowercase spelling wins when a setting is written twice."""
    heads = {"", "celery_", _namespace(conf)}
    found: dict[str, tuple[str, Any]] = {}
    for key in list(conf.keys()):
        if not isinstance(key, str):
            continue
        lowered = key.lower()
        for head in heads:
            if lowered.startswith(head + prefix):
                canonical = lowered[len(head) :]
                if canonical not in found or key == canonical:
                    found[canonical] = (key, conf[key])
                break
    return found


def _celery_setting(conf: Mapping[str, Any], name: str) -> Any:
    """A Celery setting such as ``broker_url``; through Celery's own property when the
    configuration has one (it honours ``CELERY_BROKER_URL`` in the environment)."""
    if isinstance(getattr(type(conf), name, None), property):
        return getattr(conf, name)
    for spelled in (name, name.upper(), f"CELERY_{name.upper()}"):
        if spelled in conf:
            return conf[spelled]
    return None


def _first_url(value: object) -> str | None:
    """The first URL of a broker setting: a ``;``-separated string or a list of URLs."""
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    if isinstance(value, str) and value.strip():
        return value.split(";", 1)[0].strip()
    return None


def derived_url(conf: Mapping[str, Any]) -> tuple[str, str]:
    """``(url, where it came from)`` when ``singleton_lock_url`` is not set: the broker if it
    is a Redis one, else a Redis result backend, else ``redis://localhost:6379/0``."""
    broker = _first_url(_celery_setting(conf, "broker_url"))
    if broker is not None and url_scheme(broker) in REDIS_URL_SCHEMES:
        return broker, "broker_url"
    backend = _celery_setting(conf, "result_backend")
    if isinstance(backend, str) and url_scheme(backend) in _BACKEND_SCHEMES:
        return backend, "result_backend"
    return DEFAULT_URL, "default"


def _respelled(hint: str, spelled: str) -> str:
    """``hint``'s setting names written the way the user wrote theirs (a Django
    ``CELERY_SINGLETON_LOCK_X`` gets ``CELERY_SINGLETON_LOCK_Y``, not ``singleton_lock_y``)."""
    start = spelled.lower().find(SETTING_PREFIX)
    if start <= 0 and not spelled.isupper():
        return hint
    head = spelled[:start] if start > 0 else ""

    def respell(match: re.Match[str]) -> str:
        name = head + match.group(0)
        return name.upper() if spelled.isupper() else name

    return re.sub(rf"\b{SETTING_PREFIX}\w+", respell, hint)


def read_settings(conf: Mapping[str, Any], hidden: Mapping[str, str] | None = None) -> Settings:
    """Read and validate the settings from ``app.conf`` (or any mapping).

    ``hidden`` maps a password-masked URL back to the real one (see :func:`hide_password`).
    Raises ``ImproperlyConfigured`` naming the first bad or unknown setting as written.
    """
    written = _written(conf)
    spelled_url, url = written.get(SETTING_PREFIX + "url", (None, None))
    if spelled_url is not None and hidden and isinstance(url, str) and url in hidden:
        written[SETTING_PREFIX + "url"] = (spelled_url, hidden[url])
    known = setting_names()
    task_only = set(task_option_names())
    for canonical, (spelled, _) in written.items():
        if canonical not in known and canonical not in FOREIGN_SETTINGS:
            option = TASK_OPTION_PREFIX + canonical.removeprefix(SETTING_PREFIX)
            if option in task_only:
                hint = (
                    f"{option} is a task option only, not a setting: set it on the task, "
                    "per call, or in a singleton_lock_tasks entry"
                )
            else:
                hint = _respelled(did_you_mean(canonical, known), spelled)
            raise ImproperlyConfigured(f"{spelled}: unknown setting ({hint})")
    values: dict[str, Any] = {}
    for row in setting_fields():
        entry = written.get(SETTING_PREFIX + row.name)
        if entry is None:
            continue
        spelled, value = entry
        if value is None and row.metadata["none_is_value"]:
            values[row.name] = None
        else:
            values[row.name] = row.metadata["parse"](value, spelled)
    if values.get("url") is None:
        values["url"], origin = derived_url(conf)
    else:
        origin = written[SETTING_PREFIX + "url"][0]
    return dataclasses.replace(Settings(**values), url_origin=origin)


def task_globs(conf: Mapping[str, Any]) -> list[str]:
    """The globs of ``singleton_lock_tasks`` as written, without validating anything else
    (never raises): used to decide which tasks to lock while the settings are invalid."""
    try:
        entry = _written(conf).get(SETTING_PREFIX + "tasks")
    except Exception:  # noqa: BLE001 - an unreadable configuration has no globs
        return []
    value = entry[1] if entry else None
    if isinstance(value, Mapping):
        return [glob for glob in value if isinstance(glob, str)]
    if isinstance(value, (list, tuple)):
        return [
            pair[0]
            for pair in value
            if isinstance(pair, (list, tuple)) and pair and isinstance(pair[0], str)
        ]
    return []


_cache_lock = threading.Lock()
_by_app: weakref.WeakKeyDictionary[Celery, Settings] = weakref.WeakKeyDictionary()
# Per app: masked URL -> real URL, for settings whose password was hidden in app.conf.
_hidden: weakref.WeakKeyDictionary[Celery, dict[str, str]] = weakref.WeakKeyDictionary()


def hide_password(app: Celery) -> None:
    """Replace the password of ``singleton_lock_url`` in ``app.conf`` by ``**``, keeping the
    real URL for :func:`settings_for` only.

    Celery masks ``broker_url`` and ``*backend*`` settings when it prints the configuration
    (``celery report``, ``celery inspect conf``) but not ours; after this, there is nothing
    left to leak. Idempotent; a URL without a password is left alone.
    """
    entry = _written(app.conf).get(SETTING_PREFIX + "url")
    if entry is None or not isinstance(entry[1], str):
        return
    spelled, url = entry
    masked = mask_url(url)
    if masked == url:
        return
    with _cache_lock:
        _hidden.setdefault(app, {})[masked] = url
    app.conf[spelled] = masked


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
            settings = read_settings(app.conf, _hidden.get(app))
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
