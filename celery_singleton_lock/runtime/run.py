"""The run pipeline: what happens when a delivered message of a locked task runs.

Read :func:`locked_call` and :func:`before_body` top to bottom; like Celery's own tracer it is a
fixed sequence of phases, and each phase calls the hooks of the plan's scope, modes and
conflict policy (:mod:`celery_singleton_lock.modes`)::

    resolve -> deliver -> acquire -> [on conflict] -> admit -> start -> body -> finish

The pipeline names no mode and compares no option: what differs between modes is in their
hooks. The rules that hold for every mode are written here, once: a Redis outage retries
the run (or runs it unlocked under ``singleton_lock_fail_open``), a dead earlier delivery
of this very message is taken over, and a live one makes this delivery come back later;
a run whose weight is above a stacked limit's number fails (``WeightAboveLimit``), giving
up the hold its message had (queue scope, a parked call's grant) as a lost run's is freed.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from celery import Task as CeleryTask
from celery import states
from celery.exceptions import Ignore, Reject, Retry

from celery_singleton_lock import _observe as observe
from celery_singleton_lock.exceptions import (
    LockBackendError,
    LockNotOwned,
    TaskLocked,
    WeightAboveLimit,
)
from celery_singleton_lock.modes.base import ACQUIRED, HandedCall
from celery_singleton_lock.modes.held import hold_back
from celery_singleton_lock.modes.policies import Retry as RetryPolicy
from celery_singleton_lock.modes.policies import locked, tell
from celery_singleton_lock.modes.scope import queue_owner
from celery_singleton_lock.runtime import headers as hdr
from celery_singleton_lock.runtime.context import CURRENT, RUN_ATTR, Run
from celery_singleton_lock.runtime.delivery import reclaim_from_dead_delivery
from celery_singleton_lock.runtime.finish import GivenUp, end_run, start_run
from celery_singleton_lock.runtime.locking import TaskLocking, locking_for

if TYPE_CHECKING:
    from celery import Task

    from celery_singleton_lock.engine import Holder

    AnyTask = Task[Any, Any]
else:
    AnyTask = Any

__all__ = ["body_of", "locked_call", "run_locking"]

log = logging.getLogger("celery_singleton_lock.task")


def body_of(task: AnyTask, call: Any) -> Callable[..., Any]:
    """What runs the body: ``call`` (the next ``__call__`` in the class hierarchy, so a base
    class's own ``__call__`` — an app context, a DB session, tracing — wraps the locked body),
    or ``task.run`` when that is only Celery's ``Task.__call__``, which in an eager run would
    push a second, empty request around the body."""
    func = getattr(call, "__func__", None) or getattr(call, "func", None)
    return task.run if func is CeleryTask.__call__ else call


def run_locking(task: AnyTask, request: Any) -> TaskLocking | None:
    """How this run locks: the task's locking with the options its message carries."""
    locking = locking_for(task)
    if locking is None:
        return None
    return locking.with_call_options(hdr.carried_options(request, task.name))


def resolve(
    task: AnyTask, request: Any, args: tuple[Any, ...], kwargs: dict[str, Any], call: Any
) -> Run | None:
    """The run of this delivery (``request``; None when the task is not locked)."""
    locking = run_locking(task, request)
    if locking is None:
        return None
    received = not request.is_eager
    scope = locking.plan.scope
    key = (scope.carried_key(hdr.header_key(request)) if scope.at_publish else None) or (
        locking.key(args, kwargs, received=received)
    )
    stack = locking.stack(args, kwargs, received=received) if locking.options.limits else None
    lock = locking.new_lock(task.app, key, str(request.id), stack=stack)
    body = functools.partial(body_of(task, call), *args, **kwargs)
    return Run(task, request, locking, key, lock, body)


def locked_call(task: AnyTask, args: tuple[Any, ...], kwargs: dict[str, Any], call: Any) -> Any:
    """Run the body of ``task`` under its lock (``call`` is the unlocked ``__call__``)."""
    request = task.request
    if request.called_directly or getattr(request, RUN_ATTR, None) is not None:
        # A plain function call (perhaps from inside the task's own locked run, which it
        # sees as its request): not a task run, no lock.
        return call(*args, **kwargs)
    run = resolve(task, request, args, kwargs, call)
    if run is None:
        return call(*args, **kwargs)
    try:
        rest = before_body(run)
    except Ignore as exc:
        ended = exc
    else:
        return rest()
    # A delivery that ends without running (parked, skipped, a late copy...) goes back to
    # Celery from this small frame: its tracer formats and pickles the traceback of every
    # ``Ignore`` (each frame's code positions), so the frames below are left out of it.
    raise ended.with_traceback(None)


def before_body(run: Run) -> Callable[[], Any]:
    """The phases before the body; returns the rest of the run: the body as the holder,
    the body without the lock, or the outcome of a run that does not run it."""
    plan = run.locking.plan
    try:
        for mode in plan.deliver:
            mode.deliver(run)
        acquired = run.policy.acquire(run)
        if not acquired and run.lock.found_finished:
            copy = run.scope.finished_copy(run)  # a late copy of a finished run
            return lambda: copy
        if not acquired and run.lock.held_back_by is not None:
            limited = on_limit(run)
            return lambda: limited
        if not acquired:
            holders = run.lock.holders()
            if not reclaim_from_dead_delivery(run, holders):
                outcome = on_conflict(run, holders)
                if outcome is not ACQUIRED:
                    return lambda: outcome
        for mode in plan.admit:
            if not mode.admit(run):
                return lambda: None
    except WeightAboveLimit:
        # Refused for good (it could never fit): the call fails. The hold its message had
        # when it started would otherwise stay until its lease ends.
        give_back_claim(run)
        raise
    except LockBackendError as exc:
        # The lock Redis failed at any step before the body: the outage rule, for every
        # mode (it gives back what the run holds).
        run.outage(exc)
        return run.body  # fail open: singleton_lock_fail_open runs it unlocked
    observe.acquired(run.task, run.lock, run.task_id, run.options, run.started)
    keeps = [mode.start(run) for mode in plan.start]
    start_run(run)
    if not all(keeps):
        return run.body  # freed at its start: current_lock() is None
    run.holding = True
    return functools.partial(body, run)


@dataclass(frozen=True)
class Refused(GivenUp):
    """The hold a refused run's message had (``Run.lock.claim``), given up as the run
    fails: a mode may hand it on (to a parked call, a follow-up) as at the end of a run."""

    run: Run

    given_up = (logging.INFO, "%(task)s[%(task_id)s]: refused, gave up %(key)s")

    def publish_past_lock(self, call: HandedCall) -> None:
        self.run.publish_past_lock(call)


def give_back_claim(run: Run) -> None:
    """Give up the hold ``run``'s message had when it started (its queue-scope hold, or the
    grant of a parked call: the hold its acquire would have claimed), if it still has it."""
    claim = run.lock.claim
    if not claim:
        return
    owner = run.lock.owner_of(claim)
    refused = Refused(run.task, run.task_id, owner, run.options, run)
    try:
        for mode in run.locking.plan.release:
            if mode.release(refused, states.FAILURE):
                return
        owner.release()
    except LockNotOwned:
        pass
    except LockBackendError as exc:
        log.error("could not give up the hold of %s: %s", run.key, exc)


def on_limit(run: Run) -> Any:
    """The key was free (or held for this very call: its queue-scope hold) but a stacked
    limit (``lock_limits``) had no room for the run. In run scope the run meets its
    conflict policy. In queue scope the call was accepted when it was published (its
    duplicates were given its result, or it is a follow-up handed the key): under
    ``"skip"``, ``"retry"``, ``"coalesce"`` and ``"replace"`` it comes back later, its hold
    following the message, rather than being dropped; under ``"raise"`` (and ``"wait"``
    past ``lock_wait``) its hold is given up and it fails with ``TaskLocked``. Under
    ``"park"`` (either scope) it is parked. A call that comes back waits in the lock Redis,
    never in a worker (``modes.held``), keeping its place in the lines of the limits that
    held it back."""
    policy = run.policy
    report = policy.limited_comes_back(run.scope)
    if report is not None and not run.eager:
        tell(run, report, None)
        if not policy.limited(run):
            set_aside(run)
    if run.scope.at_publish:
        give_up_queued_hold(run)
    return policy.conflict(run, None)


def set_aside(run: Run) -> NoReturn:
    """A queue-scope call that a limit held back comes back with its hold: it is kept in
    the lock Redis until its limits have room (state ``RETRY`` meanwhile; nothing is
    published now), or published again at once when they have room after all."""
    exc = locked(run, None, None)
    if hold_back(run):
        raise Retry("held back in the lock Redis until its limits have room", exc)
    raise run.retry(exc, 0.0, counted=False)


def give_up_queued_hold(run: Run) -> None:
    """Release the queue-scope hold of ``run``'s message (owner-checked: only if it is
    still the message's)."""
    try:
        queue_owner(run).release()
    except LockNotOwned:
        pass
    except LockBackendError as exc:
        log.error("could not give up the queued hold of %s: %s", run.key, exc)


def on_conflict(run: Run, holders: list[Holder]) -> Any:
    """The key stayed held (by ``holders``, as just read): an earlier delivery of this very
    message (alive elsewhere, or not provably dead) makes this one come back later, since
    skipping it would drop the work; any other holder meets the run's conflict policy."""
    # An earlier delivery of this very message, else the newest holder (of any slot).
    holder = next((found for found in holders if found.task_id == run.task_id), None) or max(
        holders, key=lambda found: found.fence or 0, default=None
    )
    if holder is not None and holder.task_id == run.task_id:
        tell(run, RetryPolicy.reported, holder)
        exc = TaskLocked(run.key, holder.task_id)
        later = run.retry(exc, run.countdown(holder), counted=False, duplicate=True)
        if isinstance(later, Retry):
            # Published to come back later. The earlier delivery owns the task id's state:
            # this one stores none (a RETRY stored after that run's SUCCESS would stay).
            raise Ignore from exc
        raise later
    return run.policy.conflict(run, holder)


def body(run: Run) -> Any:
    """Run the body as the holder (``current_lock()``), then release, before Celery stores
    the result: whoever sees the result (or ``task_success``) and calls again finds the key
    free."""
    state: str = states.FAILURE
    guards = run.locking.plan.guard
    current = CURRENT.set(run.lock)
    try:
        if guards:
            with contextlib.ExitStack() as stack:
                for mode in guards:
                    stack.enter_context(mode.guard(run))
                result = run.body()
        else:
            result = run.body()
        state = states.SUCCESS
        return result
    except Retry:
        state = states.RETRY
        raise
    except Ignore:
        state = states.IGNORED
        raise
    except Reject:
        state = states.REJECTED
        raise
    finally:
        CURRENT.reset(current)
        end_run(run, state)
