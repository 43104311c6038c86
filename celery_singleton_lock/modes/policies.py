"""The conflict policies that need no state of their own: ``skip``, ``wait``, ``retry`` and
``raise`` (``lock_on_conflict``). ``coalesce`` and ``replace`` keep a follow-up per key and
live in :mod:`.followup`.

At publish (queue scope) only ``raise`` differs: the others give the caller the holder's
``AsyncResult`` and publish nothing. In a run, a retried attempt under ``skip`` is the work
itself, not a duplicate of it, so it retries instead (:meth:`Skip.for_attempt`).
"""

from __future__ import annotations

import logging
import random
import time
from typing import TYPE_CHECKING, Any, ClassVar

from celery_singleton_lock import _observe as observe
from celery_singleton_lock.exceptions import TaskLocked, TaskThrottled
from celery_singleton_lock.modes.base import ConflictPolicy
from celery_singleton_lock.modes.explanation import conflict_explanation

if TYPE_CHECKING:
    from celery_singleton_lock.engine import Holder, RedisLock
    from celery_singleton_lock.modes.base import AnyResult, Publish, Run, Scope
    from celery_singleton_lock.options import LockOptions

__all__ = [
    "CANVAS_OPTIONS",
    "WAIT",
    "Raise",
    "Retry",
    "Skip",
    "Wait",
    "countdown",
    "jitter",
    "publish_conflict",
    "refuse_in_canvas",
]

log = logging.getLogger("celery_singleton_lock.task")
#: Jitter draws from the OS, not the global ``random``: the application's seeded state is
#: left alone, and forked pool processes do not share one sequence.
_RANDOM = random.SystemRandom()

#: The automatic countdown of a retry never goes below this many seconds.
MIN_COUNTDOWN = 0.5
#: A throttled retry comes back at the next free start plus up to this share of the wait
#: (at most a second), so retries that wait for the same start do not all arrive together.
RETRY_SPREAD = 0.1
#: Waiting for the next free start sleeps this much longer than the server said.
WAIT_MARGIN = 0.002


def jitter(seconds: float) -> float:
    """``seconds`` plus up to a quarter, so retries that wait alike do not arrive together."""
    return seconds * (1 + _RANDOM.uniform(0, 0.25))


def countdown(options: LockOptions, holder: Holder | None, retries: int) -> float:
    """When a busy run comes back: ``lock_retry_delay`` when set; else one second doubling
    with each retry, never past the holder's remaining lease (a renewed lease says nothing
    about when the holder will finish)."""
    if options.retry_delay is not None:
        return options.retry_delay
    backoff = MIN_COUNTDOWN * 2 ** min(retries + 1, 16)
    left = (holder.remaining_ms or 1000) / 1000 if holder else 1.0
    return jitter(max(MIN_COUNTDOWN, min(backoff, left, options.timeout)))


def describe_holder(holder: Holder | None) -> str:
    """Who holds a key, for a log line: the holder's task and task id, its host and pid."""
    if holder is None:
        return "nobody now (it was just freed)"
    info = holder.info
    where = "/".join(str(info[name]) for name in ("host", "pid") if info.get(name) is not None)
    if holder.task_id:
        return f"{info.get('task') or 'task'}[{holder.task_id}]" + (f" on {where}" if where else "")
    if holder.classic:
        return "a classic SETNX locker (a plain timestamp)"
    return f"a lock that is not a task's ({where or info.get('text') or 'no holder info'})"


def tell(run: Run, policy: str, holder: Holder | None) -> None:
    """Send ``lock_conflict`` for a run that applies ``policy``."""
    observe.conflict(
        run.task,
        run.key,
        run.task_id,
        policy=policy,
        scope=run.options.scope,
        holder_task_id=holder.task_id if holder else None,
        limit=held_back_by(run, holder),
    )


def held_back_by(run: Run, holder: Holder | None) -> str | None:
    """The stacked limit that held ``run`` back while its key was free (None when the key
    was held, or the task has no ``lock_limits``)."""
    return run.lock.held_back_by if holder is None else None


def explain_run(run: Run) -> dict[str, Any] | None:
    """Why the run's key (and its stacked limits) held it back, for a ``TaskLocked`` or a
    skip record."""
    return conflict_explanation(
        run.client, run.key, run.options, task=run.task.name, stack=run.lock.stack
    )


def locked(run: Run, holder: Holder | None, explanation: dict[str, Any] | None) -> TaskLocked:
    """The ``TaskLocked`` of a run that did not get its key: held by ``holder``, or free
    but a stacked limit full (the message names it)."""
    limit = held_back_by(run, holder)
    if limit is not None:
        message = (
            f"lock {run.key!r} is free, but stacked limit {limit!r} has no room for this run "
            "(lock_limits)"
        )
        return TaskLocked(run.key, None, message, explanation=explanation)
    return TaskLocked(run.key, holder.task_id if holder else None, explanation=explanation)


#: ``apply_async`` options that tie a call to a canvas waiting for it: its chain's next
#: tasks, callbacks, a chord's body, a group (whose result holds the id the canvas gave the
#: call, not the holder's). A call that publishes nothing of its own would leave them
#: waiting for ever.
CANVAS_OPTIONS = ("chain", "link", "link_error", "chord", "group_id")


def refuse_in_canvas(call: Publish, key: str, holder_id: str | None, what: str) -> None:
    """Raise ``TaskLocked`` when ``call`` carries canvas links (see :data:`CANVAS_OPTIONS`)
    but will not be published as itself (``what`` says why): the canvas learns it at once,
    instead of waiting for a message that never comes."""
    links = [name for name in CANVAS_OPTIONS if call.publish_options.get(name)]
    if links:
        raise TaskLocked(
            key,
            holder_id,
            f"{call.task.name}: this call is part of a canvas ({', '.join(links)}) and {what}; "
            "nothing would run its canvas on. Give each canvas member lock keys of its own, "
            "or lock it in run scope",
        )


def _holder_or_take(lock: RedisLock, attempts: int = 3) -> tuple[bool, Holder | None]:
    """``(taken, holder)`` after a refused queue lock: the holder of ``lock``, or, when it
    was freed in between (its run just ended), the lock taken after all."""
    holder = None
    for _ in range(attempts):
        holder = lock.holder()
        if holder is not None:
            return False, holder
        if lock.acquire(blocking=False):
            return True, None
    return False, holder


def publish_conflict(call: Publish, lock: RedisLock, *, raises: bool) -> AnyResult:
    """A queue-scope call whose key is held publishes nothing: the caller gets the holder's
    ``AsyncResult``, or ``TaskLocked`` when ``raises`` or when the holder is not a task.
    A key freed meanwhile is taken and the call published after all."""
    taken, holder = _holder_or_take(lock)
    if taken:
        return call.send_locked(lock, call.task_id)
    holder_id = holder.task_id if holder else None
    task, key = call.task, lock.name
    refuse_in_canvas(call, key, holder_id, f"would be a duplicate of {holder_id}")
    if raises or holder_id is None:
        observe.conflict(task, key, None, policy="raise", scope="queue", holder_task_id=holder_id)
        explanation = conflict_explanation(call.client, key, call.options, task=task.name)
        raise TaskLocked(key, holder_id, explanation=explanation)
    observe.conflict(task, key, None, policy="skip", scope="queue", holder_task_id=holder_id)
    log.info("%s not published: %s is queued or running as %s", task.name, key, holder_id)
    return call.result(holder_id)


class Skip(ConflictPolicy):
    """The body does not run and the task ends without error (the default)."""

    name = reported = "skip"
    outcome = "skipped"

    def for_attempt(self, retried: bool) -> ConflictPolicy:
        return UNCOUNTED_RETRY if retried else self

    def conflict(self, run: Run, holder: Holder | None) -> Any:
        holder_id = holder.task_id if holder else None
        limit = held_back_by(run, holder)
        if limit is not None:
            log.info(
                "%s[%s] skipped: stacked limit %s of %s is full",
                run.task.name,
                run.task_id,
                limit,
                run.key,
            )
        else:
            log.info(
                "%s[%s] skipped: %s is held by %s", run.task.name, run.task_id, run.key, holder_id
            )
        tell(run, "skip", holder)
        self._keep_record(run, holder_id)
        return None

    def throttled(self, run: Run, retry_in: float) -> bool:
        run.give_back()
        self._keep_record(run, None, reason="throttled")
        return False

    @staticmethod
    def _keep_record(run: Run, holder_task_id: str | None, reason: str = "held") -> None:
        """Keep the skip record of ``run`` (``skip_info``), with what it explains now."""
        observe.skipped(
            run.task,
            run.client,
            prefix=run.settings.prefix,
            key=run.key,
            task_id=run.task_id,
            holder_task_id=holder_task_id,
            reason=reason,
            explanation=explain_run(run),
        )

    def publish_conflict(self, call: Publish, lock: RedisLock) -> AnyResult:
        return publish_conflict(call, lock, raises=False)


class Retry(ConflictPolicy):
    """The run comes back later (``lock_retry_delay``, else a backoff bounded by the
    holder's lease); a throttled run comes back when its window frees."""

    name = reported = "retry"
    outcome = "retried"
    #: Whether the lock's retries count against the task's ``max_retries``.
    counted: ClassVar[bool] = True

    def conflict(self, run: Run, holder: Holder | None) -> Any:
        tell(run, "retry", holder)
        raise run.retry(locked(run, holder, None), run.countdown(holder), counted=self.counted)

    def throttled(self, run: Run, retry_in: float) -> bool:
        if run.eager:
            # Celery runs an eager retry at once, whatever its countdown: it would be
            # throttled again and again. Sit out the countdown here instead.
            time.sleep(retry_in + WAIT_MARGIN)
            return True
        run.scope.hand_back(run)
        delay = retry_in + _RANDOM.uniform(0, min(retry_in * RETRY_SPREAD, 1.0))
        raise run.retry(TaskThrottled(run.key, retry_in), delay, counted=self.counted)

    def publish_conflict(self, call: Publish, lock: RedisLock) -> AnyResult:
        return publish_conflict(call, lock, raises=False)


class _UncountedRetry(Retry):
    """A retried attempt under ``skip``: it retries, and that retry is the lock's, not the
    task's (it does not count against ``max_retries``)."""

    counted = False


UNCOUNTED_RETRY = _UncountedRetry()


class Wait(ConflictPolicy):
    """The run blocks until the key frees, at most ``lock_wait`` seconds, then raises
    ``TaskLocked``; a throttled run holds its key and sleeps until its window frees."""

    name = reported = "wait"
    outcome = "timed-out"
    waits = fails_caller = True

    def limited_comes_back(self, scope: Scope) -> str | None:
        return None  # held back by a limit, the call meets this policy in either scope

    def acquire(self, run: Run) -> bool:
        if run.lock.acquire(blocking=False):
            return True
        if run.lock.found_finished:
            return False  # a late copy of a finished run: nothing to wait for
        _log_wait(run)
        observe.conflict(
            run.task,
            run.key,
            run.task_id,
            policy="wait",
            scope=run.options.scope,
            lock=run.lock,
            limit=run.lock.held_back_by,
        )
        return run.lock.acquire(blocking=True, timeout=run.options.wait)

    def conflict(self, run: Run, holder: Holder | None) -> Any:
        raise locked(run, holder, explain_run(run))

    def throttled(self, run: Run, retry_in: float) -> bool:
        limit = run.options.wait
        left = None if limit is None else run.started + limit - time.monotonic()
        if left is None or retry_in <= left:
            time.sleep(retry_in + WAIT_MARGIN)  # holding the key: same-key runs queue up
            return True
        run.give_back()
        raise TaskThrottled(run.key, retry_in)

    def publish_conflict(self, call: Publish, lock: RedisLock) -> AnyResult:
        return publish_conflict(call, lock, raises=False)


def _log_wait(run: Run) -> None:
    """Say at INFO that a run starts waiting, for what and for how long at most, so a
    worker that waits minutes does not look hung."""
    if not log.isEnabledFor(logging.INFO):
        return
    limit_name = run.lock.held_back_by
    held_by = (
        f"nobody; stacked limit {limit_name} is full"
        if limit_name is not None
        else describe_holder(run.lock.holder())
    )
    limit = run.options.wait
    log.info(
        "%s[%s] waiting for lock %s held by %s (%s)",
        run.task.name,
        run.task_id,
        run.key,
        held_by,
        f"at most {limit:g} s, lock_wait" if limit is not None else "no limit: lock_wait=None",
    )


WAIT = Wait()


class Raise(ConflictPolicy):
    """The task fails with ``TaskLocked`` (``TaskThrottled`` when throttled)."""

    name = reported = "raise"
    outcome = "raised"
    fails_caller = True

    def limited_comes_back(self, scope: Scope) -> str | None:
        return None  # held back by a limit, the call meets this policy in either scope

    def conflict(self, run: Run, holder: Holder | None) -> Any:
        tell(run, "raise", holder)
        raise locked(run, holder, explain_run(run))

    def throttled(self, run: Run, retry_in: float) -> bool:
        run.give_back()
        raise TaskThrottled(run.key, retry_in)

    def publish_conflict(self, call: Publish, lock: RedisLock) -> AnyResult:
        return publish_conflict(call, lock, raises=True)
