"""The end of a run: its hold is given up, however the run ended.

:func:`release_after_run` runs at the end of the body and again from ``task_postrun`` (for
a run that ended without passing there); the first call does the work. A retry that took
the hold over keeps it; otherwise a mode may deal with the key (hand it to a follow-up,
keep it after a success), and the owner releases it, writing what the scope records about
the run in the same step.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from celery import states

from celery_singleton_lock import _observe as observe
from celery_singleton_lock.engine.keyspace import DONE, companion_key
from celery_singleton_lock.exceptions import LockBackendError, LockNotOwned
from celery_singleton_lock.runtime.context import RUN_ATTR

if TYPE_CHECKING:
    from celery_singleton_lock.engine import RedisLock
    from celery_singleton_lock.engine.atomic import Record
    from celery_singleton_lock.modes.base import HandedCall
    from celery_singleton_lock.options import LockOptions
    from celery_singleton_lock.runtime.context import Run

__all__ = ["GivenUp", "end_run", "finish", "release_after_run", "start_run"]

log = logging.getLogger("celery_singleton_lock.task")


@dataclass(frozen=True)
class GivenUp:
    """A hold given up outside the end of a run: a refused run's claim (``run.Refused``),
    the hold of a run that was lost or revoked (``lost.LostRun``). It is the ``Release`` a
    mode's release hook gets (``modes.base``) and writes no record; a subclass publishes a
    call handed the key, says whether it may block and how a freed hold is logged."""

    task: Any
    task_id: str
    lock: RedisLock
    options: LockOptions

    #: Whether the release may hold up its thread while Redis errs.
    blocking: ClassVar[bool] = True
    #: How a freed hold is logged: its level, and a message on ``task``, ``task_id``, ``key``.
    given_up: ClassVar[tuple[int, str]] = (logging.INFO, "%(task)s[%(task_id)s]: gave up %(key)s")

    @property
    def record(self) -> Record | None:
        return None

    def publish_past_lock(self, call: HandedCall) -> None:
        raise NotImplementedError

    def released(self, state: str | None, *, held: bool, hold: float = 0.0) -> None:
        if held:
            level, message = self.given_up
            names = {"task": self.task.name, "task_id": self.task_id, "key": self.lock.name}
            log.log(level, message, names)


def release_after_run(task: Any, task_id: str, state: str | None) -> None:
    """Give up the hold of the current run of ``task``: at the end of its body, and from
    ``task_postrun`` should a run end without passing there."""
    if not _open:  # no run of this process is between its start and its end
        return
    run: Run | None = getattr(task.request, RUN_ATTR, None)
    if run is not None:
        end_run(run, state)


#: The runs of this process that started and have not ended (by ``id``), so that
#: ``task_postrun`` after a run that ended as usual costs no request lookup.
_open: set[int] = set()


def start_run(run: Run) -> None:
    """``run`` starts (its request knows it, for ``current_lock()`` and for its end)."""
    _open.add(id(run))
    setattr(run.request, RUN_ATTR, run)


def end_run(run: Run, state: str | None) -> None:
    """Give up ``run``'s hold as its body ends in ``state`` (once: ``task_postrun`` then
    finds nothing to do)."""
    request = run.request
    if getattr(request, RUN_ATTR, None) is not run:
        return
    setattr(request, RUN_ATTR, None)
    _open.discard(id(run))
    if run.holding:
        run.holding = False
        finish(run, state)


def finished_record(run: Run) -> Record | None:
    """The record of ``run``'s task id as finished, kept as long as the plan's modes ask
    (None when none does)."""
    keeps = [mode.finished_keep(run.options) for mode in run.locking.plan.finished_keep]
    longest = max((keep for keep in keeps if keep is not None), default=None)
    if longest is None:
        return None
    return companion_key(run.key, DONE), run.task_id, max(1, int(longest * 1000))


def finish(run: Run, state: str | None) -> None:
    """Give up ``run``'s hold as the run ends in ``state``."""
    lock = run.lock
    if lock.lease_lost:
        observe.lost(run.task, lock, run.task_id, run.options)
    plan = run.locking.plan
    if state == states.RETRY and plan.scope.retried(run):
        return  # the retried message took this hold over (and detached it) when published
    # A retry that did not take the hold over (it locks other arguments, or was published
    # past a held key) frees it now rather than leave it to its lease. Any other end records
    # the task id as finished, in the same step, when a mode needs that remembered.
    if state != states.RETRY and plan.finished_keep:
        run.record = finished_record(run)
    for mode in plan.release:
        if mode.release(run, state):
            return
    try:
        lock.release(record=run.record)
    except LockNotOwned:
        run.released(state, held=False)
    except LockBackendError as exc:
        log.error("could not release lock %s of task %s: %s", lock.name, run.task_id, exc)
    else:
        run.released(state, held=True)
