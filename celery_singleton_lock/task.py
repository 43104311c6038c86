"""``LockedTask``: a Celery task that runs at most once at a time per (name, arguments).

Run scope takes the lock just before the body and the ``task_postrun`` receiver releases
it. Queue scope takes it in ``apply_async`` with an owner token derived from the task id,
so the run of that very message (and its retries) owns it, and a duplicate call publishes
nothing. Tasks listed in ``singleton_lock_tasks`` get the same behaviour without
``base=LockedTask``: ``install`` patches their classes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import socket
import threading
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from celery import Task
from celery.exceptions import ImproperlyConfigured
from celery.result import AsyncResult
from celery.utils import uuid

from celery_singleton_lock.client import redis_for
from celery_singleton_lock.config import LockOptions, Settings, settings_for
from celery_singleton_lock.exceptions import LockBackendError, LockNotOwned, TaskLocked
from celery_singleton_lock.keys import check_lock_keys, task_lock_key
from celery_singleton_lock.lock import RedisLock

__all__ = ["HEADER_KEY", "LockedTask", "current_lock", "install", "lock_for_task"]

log = logging.getLogger("celery_singleton_lock.task")

#: Message header that carries a queue-scope lock's key from the producer to the run.
HEADER_KEY = "singleton_lock_key"
_HOST = socket.gethostname()

AnyTask = Task[Any, Any]
AnyResult = AsyncResult[Any]

_current: ContextVar[RedisLock | None] = ContextVar("singleton_lock_current", default=None)
# Locks held by runs in this process, by task id, until task_postrun releases them.
_held: dict[str, tuple[RedisLock, LockOptions]] = {}
_held_guard = threading.Lock()


def current_lock() -> RedisLock | None:
    """The lock held by the task running in this thread or context, or None."""
    return _current.get()


def queue_token(task_id: str) -> str:
    """The owner token of a queue-scope lock: a function of the task id alone, so the
    producer, the run and every retry of that message are the same owner."""
    if ":" in task_id or not task_id:
        return "q-" + hashlib.sha256(task_id.encode()).hexdigest()[:32]
    return "q-" + task_id


def options_for(task: AnyTask) -> LockOptions | None:
    """The effective lock options of ``task`` (None when it is not locked); validated and
    cached on the task, so a bad option is reported at first use, before any body runs."""
    settings = settings_for(task.app)
    cached = task.__dict__.get("_singleton_lock_options")
    if cached is not None and cached[0] is settings:
        return cached[1]  # type: ignore[no-any-return]
    overrides: dict[str, Any] | None = None
    if isinstance(task, LockedTask):
        overrides = {
            name: getattr(task, name)
            for name in ("lock_timeout", "lock_renew", "lock_on_conflict", "lock_scope",
                         "lock_wait", "lock_retry_delay", "lock_queue_timeout")
            if getattr(task, name, None) is not None
        }  # fmt: skip
        if task.lock_keys is not None:
            overrides["lock_keys"] = task.lock_keys
    options = settings.options_for(task.name, overrides)
    if options is not None:
        try:
            check_lock_keys(task.run, options.keys)
        except ValueError as exc:
            raise ImproperlyConfigured(f"lock_keys of task {task.name!r}: {exc}") from exc
    task.__dict__["_singleton_lock_options"] = (settings, options)
    return options


def lock_for_task(
    task: AnyTask, key: str, options: LockOptions, task_id: str, *, queued: bool = False
) -> RedisLock:
    """The RedisLock a run (or, with ``queued``, a publish) of ``task`` uses for ``key``."""
    settings = settings_for(task.app)
    info = {"task_id": task_id, "task": task.name, "host": _HOST, "pid": os.getpid()}
    if queued:
        info["queued"] = True
    return RedisLock(
        redis_for(task.app, settings.url),
        key,
        timeout=options.queue_timeout if queued else options.timeout,
        auto_renew=options.renew and not queued,
        scripting=settings.scripting,
        token=queue_token(task_id) if options.scope == "queue" else None,
        holder_info=json.dumps(info, sort_keys=True, separators=(",", ":")),
    )


def _key(task: AnyTask, settings: Settings, options: LockOptions, args: Any, kwargs: Any) -> str:
    return task_lock_key(
        settings.prefix, task.name, task.run, tuple(args or ()), dict(kwargs or {}), options.keys
    )


def _header_key(request: Any) -> str | None:
    """The queue-scope key carried by the message, wherever Celery put the header."""
    value = getattr(request, HEADER_KEY, None)
    if value is None:
        headers = getattr(request, "headers", None) or {}
        value = headers.get(HEADER_KEY)
    return str(value) if value else None


# -- running ---------------------------------------------------------------------------


def locked_call(task: AnyTask, args: tuple[Any, ...], kwargs: dict[str, Any], call: Any) -> Any:
    """Run the body of ``task`` under its lock (``call`` is the unlocked ``__call__``)."""
    request = task.request
    if request.called_directly:
        return call(*args, **kwargs)  # a plain function call, not a task run: no lock
    options = options_for(task)
    if options is None:
        return call(*args, **kwargs)
    settings = settings_for(task.app)
    key = (_header_key(request) if options.scope == "queue" else None) or _key(
        task, settings, options, args, kwargs
    )
    task_id = str(request.id)
    lock = lock_for_task(task, key, options, task_id)
    try:
        if options.on_conflict == "wait":
            acquired = lock.acquire(blocking=True, timeout=options.wait)
        else:
            acquired = lock.acquire(blocking=False)
    except LockBackendError as exc:
        if settings.fail_open:
            log.warning(
                "singleton lock unavailable for %s[%s] (%s): running UNLOCKED because "
                "singleton_lock_fail_open is set", task.name, request.id, exc,
            )  # fmt: skip
            return task.run(*args, **kwargs)
        log.error("singleton lock unavailable for %s[%s]: %s; retrying", task.name, request.id, exc)
        raise task.retry(exc=exc, countdown=_jitter(min(5.0, options.timeout))) from exc
    if not acquired and not _reclaim_from_dead_delivery(task, lock):
        return _on_conflict(task, lock, key, options)
    with _held_guard:
        _held[task_id] = (lock, options)
    context = _current.set(lock)
    try:
        return task.run(*args, **kwargs)
    finally:
        _current.reset(context)


def _jitter(seconds: float) -> float:
    return seconds * (1 + random.uniform(0, 0.25))


def _process_gone(pid: object) -> bool:
    """Whether ``pid`` names no live process on this host."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _reclaim_from_dead_delivery(task: AnyTask, lock: RedisLock) -> bool:
    """Take the lock over from an earlier delivery of this very message whose process died
    holding it (acks_late + reject_on_worker_lost requeues without any failure signal):
    only when the holder is this task id, on this host, in a process that no longer exists."""
    holder = lock.holder()
    if holder is None or holder.task_id != task.request.id or holder.token is None:
        return False
    if holder.info.get("host") != _HOST or not _process_gone(holder.info.get("pid")):
        return False
    dead = RedisLock(lock.client, lock.name, token=holder.token, scripting=lock.scripting)
    try:
        dead.release()
    except LockNotOwned:
        return False
    log.warning(
        "%s[%s]: took over the lock its dead earlier delivery held", task.name, task.request.id
    )
    return lock.acquire(blocking=False)


def _on_conflict(task: AnyTask, lock: RedisLock, key: str, options: LockOptions) -> Any:
    """Apply the conflict policy when another run holds ``key``."""
    holder = lock.holder()
    holder_id = holder.task_id if holder else None
    if holder is not None and holder_id == task.request.id:
        # An earlier delivery of this same message still holds it (alive elsewhere, or not
        # provably dead): skipping would drop the work, so come back when its lease ends.
        left = (holder.remaining_ms or 1000) / 1000
        raise task.retry(exc=TaskLocked(key, holder_id), countdown=_jitter(max(left, 0.5)))
    if options.on_conflict == "skip":
        log.info("%s[%s] skipped: %s is held by %s", task.name, task.request.id, key, holder_id)
        return None
    if options.on_conflict == "retry":
        if options.retry_delay is not None:
            countdown = options.retry_delay
        else:
            left = (holder.remaining_ms or 1000) / 1000 if holder else 1.0
            countdown = _jitter(min(max(left, 0.5), options.timeout))
        raise task.retry(exc=TaskLocked(key, holder_id), countdown=countdown)
    raise TaskLocked(key, holder_id)  # "raise", and "wait" that timed out


def release_after_run(task_id: str, state: str | None) -> None:
    """Release the lock a run of ``task_id`` took (called from ``task_postrun``)."""
    with _held_guard:
        entry = _held.pop(task_id, None)
    if entry is None:
        return
    lock, options = entry
    if state == "RETRY" and options.scope == "queue":
        lock.detach()  # the retried message owns it now (same token); apply_async set its lease
        return
    try:
        lock.release()
    except LockNotOwned:
        log.warning("lock %s of task %s had expired before the run ended", lock.name, task_id)
    except LockBackendError as exc:
        log.error("could not release lock %s of task %s: %s", lock.name, task_id, exc)


def release_for_lost_run(task: AnyTask, task_id: str, args: Any, kwargs: Any, request: Any) -> bool:
    """Release the lock held by a run that can no longer release it (its process died,
    or it was revoked): only if the holder recorded in Redis is that very task id."""
    options = options_for(task)
    if options is None:
        return False
    settings = settings_for(task.app)
    key = _header_key(request) or _key(task, settings, options, args, kwargs)
    probe = lock_for_task(task, key, options, task_id)
    holder = probe.holder()
    if holder is None or holder.task_id != task_id or holder.token is None:
        return False
    owner = RedisLock(probe.client, key, token=holder.token, scripting=settings.scripting)
    try:
        owner.release()
    except LockNotOwned:
        return False
    log.warning("released lock %s of lost or revoked task %s[%s]", key, task.name, task_id)
    return True


# -- publishing ------------------------------------------------------------------------


def locked_apply_async(
    task: AnyTask, publish: Callable[..., AnyResult], args: Any, kwargs: Any, **options: Any
) -> AnyResult:
    """``apply_async`` for queue scope: take the lock, then publish; a duplicate publishes
    nothing and gets the holder's AsyncResult (or TaskLocked under ``raise``)."""
    lock_options = options_for(task)
    if lock_options is None or lock_options.scope != "queue":
        return publish(args, kwargs, **options)
    settings = settings_for(task.app)
    task_id = options.pop("task_id", None) or uuid()
    key = _key(task, settings, lock_options, args, kwargs)
    running = current_lock()
    if running is not None and running.name == key and running.token == queue_token(task_id):
        running.detach()  # self.retry(): hand the lock over to the retried message
    lock = lock_for_task(task, key, lock_options, task_id, queued=True)
    try:
        acquired = lock.acquire(blocking=False)
    except LockBackendError:
        if not settings.fail_open:
            raise
        log.warning("singleton lock unavailable: publishing %s[%s] unlocked", task.name, task_id)
        return publish(args, kwargs, task_id=task_id, **options)
    if not acquired:
        holder = lock.holder()
        holder_id = holder.task_id if holder else None
        if lock_options.on_conflict == "raise" or holder_id is None:
            raise TaskLocked(key, holder_id)
        log.info("%s not published: %s is queued or running as %s", task.name, key, holder_id)
        return task.AsyncResult(holder_id)
    headers = dict(options.pop("headers", None) or {})
    headers[HEADER_KEY] = key
    try:
        return publish(args, kwargs, task_id=task_id, headers=headers, **options)
    except BaseException:
        try:
            lock.release()
        except Exception:  # the publish error is the one to report
            log.exception("could not release %s after a failed publish", key)
        raise


class LockedTask(Task[Any, Any]):
    """Base class for tasks that must not run twice at once for the same arguments.

    Options (class attributes, usually given to ``@app.task``): ``lock_keys``,
    ``lock_timeout``, ``lock_renew``, ``lock_on_conflict``, ``lock_scope``, ``lock_wait``,
    ``lock_retry_delay``, ``lock_queue_timeout``; None means "from the
    ``singleton_lock_*`` settings".
    """

    lock_keys: Any = None
    lock_timeout: float | None = None
    lock_renew: bool | None = None
    lock_on_conflict: str | None = None
    lock_scope: str | None = None
    lock_wait: float | None = None
    lock_retry_delay: float | None = None
    lock_queue_timeout: float | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return locked_call(self, args, kwargs, super().__call__)

    def apply_async(  # type: ignore[override]  # same call shape, options forwarded as-is
        self, args: Any = None, kwargs: Any = None, **options: Any
    ) -> AnyResult:
        return locked_apply_async(self, super().apply_async, args, kwargs, **options)


def install(app: Any) -> None:
    """Give tasks matched by ``singleton_lock_tasks`` the LockedTask behaviour (idempotent).

    Runs when an app is finalized and when a worker or beat starts; tasks that already
    derive from LockedTask are left alone.
    """
    settings = settings_for(app)
    if not settings.tasks:
        return
    for name, task in list(app.tasks.items()):
        cls = type(task)
        if isinstance(task, LockedTask) or cls.__dict__.get("_singleton_lock_patched"):
            continue
        if settings.options_for(name, None) is None:
            continue
        _patch(cls)


def _patch(cls: type[AnyTask]) -> None:
    original_call = cls.__call__
    original_apply = cls.apply_async

    def call(self: AnyTask, *args: Any, **kwargs: Any) -> Any:
        return locked_call(self, args, kwargs, lambda *a, **k: original_call(self, *a, **k))

    def apply_async(self: AnyTask, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        return locked_apply_async(
            self, lambda *a, **k: original_apply(self, *a, **k), args, kwargs, **options
        )

    cls.__call__ = call  # type: ignore[method-assign]
    cls.apply_async = apply_async  # type: ignore[method-assign,assignment]
    cls._singleton_lock_patched = True  # type: ignore[attr-defined]
