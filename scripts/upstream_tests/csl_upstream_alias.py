"""Aliases for running celery-singleton's and celery-once's own tests against our shims.

Importing this module (as a pytest plugin, ``-p csl_upstream_alias``, or first thing in a
worker launcher) puts module objects named ``celery_singleton``, ``celery_singleton.singleton``,
``celery_once`` and ``celery_once.tasks`` into ``sys.modules`` of *this process only*: they
hold the public names of :mod:`celery_singleton_lock.compat.singleton` and
:mod:`celery_singleton_lock.compat.once`. Nothing is installed under those names and no
other process sees them. It refuses to run if the real packages were imported already.

celery-singleton's test module also imports a few private modules at its top and uses two
of their names in its cleanup fixture (``get_backend(Config(app)).redis.flushall()``).
Harness stand-ins for exactly those are provided below, so that the module imports and its
fixture empties the run's private redis-server; they are not part of the shim, and the
internal tests that exercise those private names are not run (see ``run.py``).
"""

from __future__ import annotations

import sys
import types
from typing import Any

import redis

from celery_singleton_lock.compat import once, singleton

#: Alias module name -> (shim module, names it exposes).
PUBLIC = {
    "celery_singleton": (singleton, ("Singleton", "clear_locks", "DuplicateTaskError")),
    "celery_singleton.singleton": (singleton, ("Singleton", "clear_locks")),
    "celery_singleton.exceptions": (
        singleton,
        ("DuplicateTaskError", "CelerySingletonException"),
    ),
    "celery_once": (once, ("QueueOnce", "AlreadyQueued")),
    "celery_once.tasks": (once, ("QueueOnce", "AlreadyQueued")),
}


class HarnessConfig:
    """Stand-in for celery-singleton's private ``Config``: only what the upstream cleanup
    fixture touches (the app)."""

    def __init__(self, app: Any) -> None:
        self.app = app


class HarnessStore:
    """Stand-in for celery-singleton's storage object: ``.redis`` is a client of the Redis
    that holds the app's locks (the run's private server)."""

    def __init__(self, url: str) -> None:
        self.redis = redis.Redis.from_url(url, decode_responses=True)


def harness_get_backend(config: HarnessConfig) -> HarnessStore:
    """Stand-in for ``celery_singleton.backends.get_backend``."""
    url, _ = singleton.lock_store(config.app)
    return HarnessStore(url)


class HarnessRedisBackend:
    """Placeholder so that the upstream module's ``mock.patch.object(RedisBackend, ...)``
    decorators can be created; the tests using it are internal and not run."""


def harness_generate_lock(*args: Any, **kwargs: Any) -> str:
    """Placeholder named in a ``mock.patch.object`` decorator of an internal test (not run);
    the old key format is not reproduced."""
    raise NotImplementedError("celery-singleton's private key builder is not part of the shim")


#: Private upstream modules the test module imports at its top: harness stand-ins.
HARNESS: dict[str, dict[str, Any]] = {
    "celery_singleton.util": {"generate_lock": harness_generate_lock},
    "celery_singleton.config": {"Config": HarnessConfig},
    "celery_singleton.backends": {"get_backend": harness_get_backend},
    "celery_singleton.backends.redis": {"RedisBackend": HarnessRedisBackend},
}


def _module(name: str, attributes: dict[str, Any], doc: str) -> types.ModuleType:
    module = types.ModuleType(name, doc)
    module.__dict__.update(attributes)
    module.__path__ = []  # a package, so its submodules can be imported from it
    return module


def install() -> None:
    """Put the alias modules into ``sys.modules`` (idempotent)."""
    for real in ("celery_singleton", "celery_once"):
        found = sys.modules.get(real)
        if found is not None and not getattr(found, "__csl_alias__", False):
            raise RuntimeError(f"the real {real} package is imported already; aliases refused")
    modules: dict[str, types.ModuleType] = {}
    for name, (shim, names) in PUBLIC.items():
        attributes = {attr: getattr(shim, attr) for attr in names}
        modules[name] = _module(name, attributes, f"Test-run alias of {shim.__name__}.")
    for name, attributes in HARNESS.items():
        modules[name] = _module(name, attributes, "Test-run harness stand-in (not the shim).")
    for name, module in modules.items():
        module.__dict__["__csl_alias__"] = True
        sys.modules[name] = module
    for name, module in modules.items():
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(modules[parent], child, module)


install()
