"""How the package plugs into a Celery app: :func:`setup`, once per app.

``setup(app)`` connects the signal receivers and, for tasks named in
``singleton_lock_tasks``, adds a task annotation (Celery's documented way to change task
classes from configuration) that gives them the ``LockedTask`` behaviour: their
``__call__`` runs the body under the lock, their ``apply_async`` takes queue-scope locks,
and they get ``lock_key()`` and ``lock_explain()``. Annotations are applied by Celery
whenever a task class binds to the app, so tasks imported late (autodiscovery in a
worker) are covered too.

``setup`` runs when a ``LockedTask`` binds to an app and, through Celery's app-finalize
hook, for every app finalized in a process that imported the Celery side of this package
(``celery worker``/``beat`` always do, through the ``celery locks`` command's entry point).
"""

from __future__ import annotations

import fnmatch
import functools
import logging
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import redis
from celery import bootsteps
from celery import signals as celery_signals
from celery._state import connect_on_app_finalize
from celery.app.annotations import prepare
from celery.exceptions import CeleryCommandException, ImproperlyConfigured
from celery.utils.functional import firstmethod

from celery_singleton_lock import _observe as observe
from celery_singleton_lock import runtime, signals
from celery_singleton_lock.client import mask_url, redis_for
from celery_singleton_lock.config import EX_CONFIG, hide_password, settings_for, task_globs
from celery_singleton_lock.explain import Explanation, explain_key, weighed_stack
from celery_singleton_lock.modes.held import holds_back

if TYPE_CHECKING:
    from celery import Celery

__all__ = ["ConfigLocks", "ParkSweep", "Preflight", "WorkerConfigError", "preflight", "setup"]

log = logging.getLogger("celery_singleton_lock.worker")

_SETUP_FLAG = "_singleton_lock_setup"
_first_annotation = firstmethod("annotate")  # type: ignore[arg-type]  # typed as a callable in celery-types
_guard = threading.Lock()


def setup(app: Celery) -> None:
    """Make ``app`` ready for locked tasks; idempotent, and safe to call at any time."""
    if app.__dict__.get(_SETUP_FLAG):
        return
    with _guard:
        if app.__dict__.get(_SETUP_FLAG):
            return
        signals.connect()
        app.steps["worker"].add(Preflight)
        app.steps["worker"].add(ParkSweep)
        app.__dict__[_SETUP_FLAG] = True
    if getattr(app, "finalized", False):  # else the app-finalize hook installs them
        _install_annotations(app)


class WorkerConfigError(CeleryCommandException, ImproperlyConfigured):
    """A bad setting or task option found at worker start: the ``celery worker`` command
    prints its one-line message and exits with status 78 (EX_CONFIG)."""


def preflight(app: Celery, pool: type | None = None) -> None:
    """Check everything a worker of ``app`` will need before it takes a message: the
    settings, every locked task's options (against the worker's ``pool`` class, when
    known), and where the locks live (logged, URL masked).

    Raises ``ImproperlyConfigured`` naming the first bad setting or option.
    """
    hide_password(app)
    settings = settings_for(app)
    locked = []
    for task in app.tasks.values():
        locking = runtime.locking_for(task)
        if locking is None:
            continue
        locked.append(task.name)
        for mode in locking.plan.hooks:
            problem = mode.worker_problem(locking.options, pool)
            if problem is not None:
                raise ImproperlyConfigured(f"task {task.name!r}: {problem}")
    origin = settings.url_origin
    log.info(
        "singleton locks: %d locked task(s) on %s (%s)",
        len(locked),
        mask_url(settings.url),
        "from " + origin
        if origin != "default"
        else "the default: no Redis broker, backend or singleton_lock_url",
    )
    if origin == "default":
        log.warning(
            "singleton locks: no singleton_lock_url is set and neither the broker nor the "
            "result backend is Redis, so locks go to %s; set singleton_lock_url",
            settings.url,
        )
    if locked:
        try:
            redis_for(app, settings.url).ping()
        except redis.RedisError as exc:
            log.error(
                "singleton locks: the lock Redis at %s is unreachable (%s); locked tasks will "
                "retry until it answers. Set singleton_lock_url if this is the wrong server.",
                mask_url(settings.url),
                exc,
            )


class Preflight(bootsteps.Step):
    """Worker bootstep: run :func:`preflight` before the worker consumes, and refuse to
    start (exit 78, one line naming the setting) on a bad configuration."""

    name = "celery_singleton_lock.preflight"

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        # The lock's worker events follow the worker's task events (-E), as Celery's do.
        observe.worker_events(bool(getattr(worker, "task_events", False)))
        try:
            pool = getattr(worker, "pool_cls", None)
            preflight(worker.app, pool=pool if isinstance(pool, type) else None)
        except ImproperlyConfigured as exc:
            message = " ".join(str(exc).split())
            raise WorkerConfigError(message=message, exit_code=EX_CONFIG) from exc


class ParkSweep(bootsteps.StartStopStep):
    """Worker bootstep: in the main process of a worker whose app has tasks that set calls
    aside in the lock Redis (``lock_on_conflict`` park, coalesce or replace), sweep their
    keys now and then, so no such call is lost (see :mod:`.runtime.sweep`)."""

    name = "celery_singleton_lock.park_sweep"
    requires = ("celery.worker.components:Timer",)

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.sweeper: Any = None

    def create(self, worker: Any) -> None:
        if parks(worker.app):
            self.sweeper = runtime.Sweeper(worker.app)

    def start(self, worker: Any) -> None:
        if self.sweeper is not None:
            self.sweeper.start()

    def stop(self, worker: Any) -> None:
        if self.sweeper is not None:
            self.sweeper.stop()


def parks(app: Celery) -> bool:
    """Whether any locked task of ``app`` sets calls aside in the lock Redis (parks them,
    keeps follow-ups, or holds calls back until their limits have room)."""
    return any(
        (locking := runtime.locking_for(task)) is not None
        and (locking.plan.policy.keeps_calls or holds_back(locking.options))
        for task in list(app.tasks.values())
    )


def _around_call(original: Callable[..., Any]) -> Callable[..., Any]:
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        return runtime.locked_call(self, args, kwargs, functools.partial(original, self))

    return call


def _around_apply_async(original: Callable[..., Any]) -> Callable[..., Any]:
    def apply_async(self: Any, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        return runtime.locked_apply_async(
            self, functools.partial(original, self), args, kwargs, **options
        )

    return apply_async


def _compose(ours: Callable[..., Any], theirs: Any) -> Callable[..., Any]:
    """One ``@method`` annotation out of ours and a user's: ours around theirs."""
    return lambda original: ours(theirs(original))


class ConfigLocks:
    """A task annotation that locks the tasks ``singleton_lock_tasks`` matches.

    Celery applies only the *first* annotation that answers for a task, so this one comes
    first and, for the tasks it locks, answers with the app's own annotation for that task
    merged in; for other tasks it stays silent and Celery goes on to the app's annotations.
    """

    def __init__(self, app: Celery, theirs: Any) -> None:
        self.app = app
        self.theirs = prepare(theirs)

    def __repr__(self) -> str:
        return "<celery_singleton_lock: singleton_lock_tasks annotation>"

    def matches(self, task_name: str) -> bool:
        """Whether ``singleton_lock_tasks`` locks ``task_name``. With invalid settings the
        globs as written decide, so the task's first use reports the configuration error
        instead of running unlocked."""
        try:
            return settings_for(self.app).locks_task(task_name)
        except ImproperlyConfigured:
            return any(fnmatch.fnmatchcase(task_name, glob) for glob in task_globs(self.app.conf))

    def annotate(self, task: Any) -> dict[str, Any] | None:
        """Celery's hook: the attributes and ``@method`` wrappers for ``task``'s class."""
        if getattr(task, runtime.LOCKED_MARKER, False) or not self.matches(task.name):
            return None
        theirs: Mapping[str, Any] = _first_annotation(self.theirs, task) or {}
        result = dict(theirs)
        for name, around in (("@__call__", _around_call), ("@apply_async", _around_apply_async)):
            result[name] = _compose(around, theirs[name]) if name in theirs else around
        result["lock_key"] = runtime.lock_key_method
        result["lock_explain"] = lock_explain_method
        return result


def lock_explain_method(self: Any, *args: Any, **kwargs: Any) -> Explanation:
    """Why a call with these arguments would be blocked now: who holds its key (task id,
    host/pid, since when, lease left, fencing token), who waits and in which order, what is
    parked, pending, throttled or debouncing there, and how full its stacked limits are (see
    :class:`celery_singleton_lock.explain.Explanation`), read from the lock Redis on its
    clock in two round trips at most. Installed as ``task.lock_explain`` on every locked
    task."""
    key = runtime.lock_key_method(self, *args, **kwargs)  # not locked: ImproperlyConfigured
    locking = runtime.locking_for(self)
    options = locking.options if locking is not None else None
    stack, weight_error = (
        weighed_stack(locking, args, kwargs) if locking is not None else (None, None)
    )
    client = redis_for(self.app, settings_for(self.app).url)
    return explain_key(client, key, options, task=self.name, stack=stack, weight_error=weight_error)


def _apply(cls: Any, annotation: Mapping[str, Any]) -> None:
    """Apply one annotation to a task class the way ``Task.annotate`` does."""
    for key, value in annotation.items():
        if key.startswith("@"):
            cls.add_around(key[1:], value)
        else:
            setattr(cls, key, value)


def _install_annotations(app: Celery) -> None:
    """Put :class:`ConfigLocks` first in ``task_annotations`` and lock the tasks that bound
    before it was there."""
    current = app.conf.task_annotations
    listed = list(current) if isinstance(current, (list, tuple)) else [current] if current else []
    if listed and isinstance(listed[0], ConfigLocks):
        return
    ours = ConfigLocks(app, listed)
    app.conf.task_annotations = [ours, *listed]
    app.__dict__.pop("annotations", None)  # Celery caches the prepared setting
    for task in list(app.tasks.values()):
        if type(task).__bound__:
            found = ours.annotate(task)
            if found:
                _apply(type(task), found)


@connect_on_app_finalize
def _on_app_finalize(app: Celery) -> None:
    setup(app)
    _install_annotations(app)


def _on_import_modules(sender: Any = None, **_: Any) -> None:
    """Celery loads an app's task modules (worker, beat, ``celery report``): hide the lock
    URL's password before anything prints the configuration."""
    if sender is not None and hasattr(sender, "conf"):
        try:
            hide_password(sender)
        except Exception:  # a broken configuration is reported where it is used
            log.debug("could not hide the lock URL password", exc_info=True)


celery_signals.import_modules.connect(
    _on_import_modules, weak=False, dispatch_uid="celery_singleton_lock.hide_password"
)
