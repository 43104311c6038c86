"""The publish pipeline: what ``apply_async`` of a locked task does.

Read :func:`locked_apply_async` top to bottom::

    resolve -> before publish -> queue lock -> [on conflict] -> publish

``before_publish`` hooks may publish the call themselves (a debounced call joins its burst).
A scope that locks at publish (queue scope) takes the lock under a token derived from the
task id before the message exists; a call whose key is held meets the conflict policy
(a duplicate gets the holder's ``AsyncResult``, or ``TaskLocked``, or becomes a follow-up).
The rules for every mode are written here once: a task's own ``self.retry()`` is the work
itself and is never refused, and a task id already queued, running or done is not published
again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from celery.utils import uuid

from celery_singleton_lock import _observe as observe
from celery_singleton_lock.exceptions import LockBackendError
from celery_singleton_lock.runtime import headers as hdr
from celery_singleton_lock.runtime.context import RUN_ATTR, Publish
from celery_singleton_lock.runtime.delivery import known_task
from celery_singleton_lock.runtime.locking import TaskLocking, locking_for

if TYPE_CHECKING:
    from celery import Task
    from celery.result import AsyncResult

    from celery_singleton_lock.runtime.context import Run

    AnyTask = Task[Any, Any]
    AnyResult = AsyncResult[Any]
else:
    AnyTask = Any
    AnyResult = Any

__all__ = ["locked_apply_async"]

log = logging.getLogger("celery_singleton_lock.task")


def locked_apply_async(
    task: AnyTask, send: Callable[..., AnyResult], args: Any, kwargs: Any, **options: Any
) -> AnyResult:
    """``apply_async`` of a locked task (``send`` is the unlocked one)."""
    republish = options.pop(hdr.REPUBLISH_OPTION, None)
    wait = options.pop(hdr.PUBLISH_WAIT_OPTION, 0.0)
    if republish is not None:  # a retry or follow-up the lock layer publishes itself
        headers = {**(options.pop("headers", None) or {}), **republish}
        return send(args, kwargs, headers=headers, **options)
    locking = locking_for(task)
    if locking is None:
        return send(args, kwargs, **options)
    locking = _with_call_options(task, locking, options)
    plan = locking.plan
    if not plan.before_publish and not plan.scope.at_publish:
        return send(args, kwargs, **options)  # nothing happens at publish for this task
    call = Publish(task, send, tuple(args or ()), dict(kwargs or {}), options, locking)
    for mode in plan.before_publish:
        published = mode.before_publish(call)
        if published is not None:
            return published
    if not plan.scope.at_publish:
        return call.send()
    return _queue_lock(call, wait)


def _with_call_options(task: AnyTask, locking: TaskLocking, options: dict[str, Any]) -> TaskLocking:
    """Take the ``lock_*`` options of one call out of ``options``: the task's locking with
    them applied, and the message carries them (a header) to the run."""
    given = hdr.pop_call_options(task.name, options)
    if not given:
        return locking
    headers = dict(options.pop("headers", None) or {})
    headers[hdr.HEADER_OPTIONS] = {
        name: list(value) if isinstance(value, tuple) else value for name, value in given.items()
    }
    options["headers"] = headers
    return locking.with_call_options(given)


def _request_of(task: Any) -> Any:
    """The task's current request, or None while another thread is still binding the task
    (Celery marks a task bound before it gives it its request stack)."""
    if getattr(task, "request_stack", None) is None:
        return None
    return task.request


def _queue_lock(call: Publish, wait: float | None) -> AnyResult:
    """Take the call's lock, then publish; a held key meets the conflict policy."""
    task, settings = call.task, call.locking.settings
    explicit_id = call.publish_options.pop("task_id", None)
    call.task_id = task_id = explicit_id or uuid()
    key = call.key()
    running: Run | None = getattr(_request_of(task), RUN_ATTR, None)
    # self.retry() of the run in progress (same key, same task id) is the work itself: it is
    # published even when another message holds the key now. A run that still holds its
    # key hands its hold to the retried message.
    own_retry = running is not None and running.key == key and running.task_id == task_id
    handing_over = own_retry and running is not None and running.holding
    claim = None
    if handing_over and running is not None:
        if running.lock.lease_lost:
            # The hold the retry would take over was lost while the run went on: say so
            # (lock_lost) before the hold is handed on, as the end of a run would.
            observe.lost(task, running.lock, running.task_id, running.options)
        claim = running.lock.token
        running.lock.detach()
    lock = call.queue_lock(task_id, claim=claim)
    try:
        if explicit_id and not handing_over and known_task(lock, task_id):
            log.warning(
                "%s[%s] not published: a call with that task id is queued, running or "
                "finished lately under %s, and a task id runs once (a new job needs a new "
                "task id)",
                task.name,
                task_id,
                key,
            )
            return call.result(task_id)
        acquired = lock.acquire(blocking=wait != 0, timeout=wait)
    except LockBackendError as exc:
        if not own_retry and not settings.fail_open:
            raise
        if not own_retry:
            log.warning(
                "singleton lock unavailable: publishing %s[%s] unlocked", task.name, task_id
            )
            return call.send(task_id=task_id)
        # Celery drops a message whose retry cannot be published: publish it; it takes the
        # lock when it runs.
        log.warning(
            "%s[%s]: lock Redis unreachable at its retry (%s); publishing the retry, "
            "which takes %s when it runs",
            task.name,
            task_id,
            exc,
            key,
        )
        acquired = True
    if not acquired and own_retry:
        log.warning(
            "%s[%s]: could not take %s for its retry (its lease ended, or it freed "
            "at the start); retrying unlocked until it can take it again",
            task.name,
            task_id,
            key,
        )
        acquired = True
    if not acquired:
        return call.locking.plan.policy.publish_conflict(call, lock)
    return call.send_locked(lock, task_id)
