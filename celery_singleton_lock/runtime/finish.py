"""The end of a run: its hold is given up, however the run ended.

:func:`release_after_run` runs at the end of the body and again from ``task_postrun`` (for
a run that ended without passing there); the first call does the work. A retry that took
the hold over keeps it; otherwise a mode may deal with the key (hand it to a follow-up,
keep it after a success), and the owner releases it, writing what the scope records about
the run in the same step.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from celery import states

from celery_singleton_lock import _observe as observe
from celery_singleton_lock.exceptions import LockBackendError, LockNotOwned
from celery_singleton_lock.runtime.context import RUN_ATTR

if TYPE_CHECKING:
    from celery_singleton_lock.runtime.context import Run

__all__ = ["finish", "release_after_run"]

log = logging.getLogger("celery_singleton_lock.task")


def release_after_run(task: Any, task_id: str, state: str | None) -> None:
    """Give up the hold of the current run of ``task``: at the end of its body, and from
    ``task_postrun`` should a run end without passing there."""
    request = task.request
    run: Run | None = getattr(request, RUN_ATTR, None)
    if run is None:
        return
    setattr(request, RUN_ATTR, None)
    if run.holding:
        run.holding = False
        finish(run, state)


def finish(run: Run, state: str | None) -> None:
    """Give up ``run``'s hold as the run ends in ``state``."""
    lock = run.lock
    if lock.lease_lost:
        observe.lost(run.task, lock, run.task_id, run.options)
    plan = run.locking.plan
    if state == states.RETRY and plan.scope.retried(run):
        return  # the retried message took this hold over (and detached it) when published
    # A retry that did not take the hold over (it locks other arguments, or was published
    # past a held key) frees it now rather than leave it to its lease.
    run.record = plan.scope.finished_record(run, state)
    for mode in plan.hooks:
        if mode.release(run, state):
            return
    try:
        lock.release(record=run.record)
    except LockNotOwned:
        log.warning("lock %s of task %s had expired before the run ended", lock.name, run.task_id)
        observe.lost(run.task, lock, run.task_id, run.options)
    except LockBackendError as exc:
        log.error("could not release lock %s of task %s: %s", lock.name, run.task_id, exc)
    else:
        observe.released(run.task, lock, run.task_id, run.options, state)
