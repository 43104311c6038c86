"""``lock_scope``: when a call's lock is taken.

``run`` (the default) takes it just before the body and releases it when the run ends.
``queue`` takes it in ``apply_async`` under an owner token derived from the task id, so the
run of that very message (and its retries) owns it, and a duplicate call publishes nothing.
The delivery that runs the message claims that hold under a token of its own, so a second
delivery of the same message is a rival. A queue-scope run that ends records its task id
beside the key (``keyspace.DONE``), so a late duplicate delivery does not run it again.
"""

from __future__ import annotations

import hashlib
import logging
import time
from typing import TYPE_CHECKING, Any, NoReturn

from celery import states
from celery.exceptions import Ignore

from celery_singleton_lock.engine import RedisLock
from celery_singleton_lock.engine.keyspace import DONE, companion_key
from celery_singleton_lock.engine.wire import call
from celery_singleton_lock.exceptions import LockBackendError, ResultLost
from celery_singleton_lock.modes.base import Scope
from celery_singleton_lock.modes.parking import HEADER_HELD, leave_held

if TYPE_CHECKING:
    from celery_singleton_lock.modes.base import Release, Run
    from celery_singleton_lock.options import LockOptions

__all__ = [
    "RESULT_GRACE",
    "QueueScope",
    "RunScope",
    "drop_late_copy",
    "finished",
    "queue_owner",
    "queue_token",
    "task_group",
]

log = logging.getLogger("celery_singleton_lock.task")

#: How long (seconds) a late copy of a finished run waits for that run's result to show in
#: the result backend before it takes the result for lost.
RESULT_GRACE = 2.0


def queue_token(task_id: str, limit: int = 1) -> str:
    """The owner token of a queue-scope lock: a function of the task id alone, so the
    producer, the run and every retry of that message are the same owner. With slots
    (``limit`` > 1) it belongs to the task's group, so it never holds a second slot."""
    if limit > 1:
        return task_group(task_id) + "q"
    if ":" in task_id or not task_id:
        return "q-" + hashlib.sha256(task_id.encode()).hexdigest()[:32]
    return "q-" + task_id


def queue_owner(run: Run) -> RedisLock:
    """The owner of the hold taken for ``run``'s message before it ran (its queue-scope
    hold, or the grant of a parked call), to give it up or hand it on."""
    return run.lock.owner_of(queue_token(run.task_id, run.options.limit))


def task_group(task_id: str) -> str:
    """The token prefix of every hold of one task id (its publish and its deliveries): a
    lock with slots never gives one group two slots."""
    return "t" + hashlib.sha256(task_id.encode()).hexdigest()[:16] + "-"


def finished(lock: RedisLock, task_id: str) -> bool:
    """Whether a run of ``task_id`` finished under ``lock``'s key lately (within the time
    its task id is kept: see ``Mode.finished_keep``)."""
    return call(lock.name, lock.client.zscore, companion_key(lock.name, DONE), task_id) is not None


def drop_late_copy(run: Run, why: str) -> NoReturn:
    """End a copy of a message whose run finished without running it (``Ignore``): the
    first delivery's result stands. When the result backend has none after
    ``RESULT_GRACE`` seconds (that worker died between the end of the run and storing the
    result), store ``ResultLost`` as the call's failure, so it still ends in a visible
    state rather than ``PENDING`` for ever."""
    log.info("%s[%s] not run again: %s", run.task.name, run.task_id, why)
    if run.header(HEADER_HELD) is not None:
        try:  # a copy held back in the lock Redis is not handed out again either
            leave_held(run)
        except LockBackendError as exc:
            log.warning("could not clear %s from the held calls: %s", run.task_id, exc)
    task = run.task
    if getattr(task, "ignore_result", False) or run.eager:
        raise Ignore
    backend = task.backend
    deadline = time.monotonic() + RESULT_GRACE
    try:
        while task.backend.get_task_meta(run.task_id, cache=False)["status"] not in (
            states.READY_STATES
        ):
            if time.monotonic() >= deadline:
                log.error(
                    "%s[%s]: its run finished under %s, but no result was stored; "
                    "storing ResultLost",
                    task.name,
                    run.task_id,
                    run.key,
                )
                backend.mark_as_failure(
                    run.task_id, ResultLost(run.task_id, run.key), request=run.request
                )
                break
            time.sleep(0.1)
    except (NotImplementedError, AttributeError):  # no result backend
        pass
    except Exception:  # a backend error must not run the work again either
        log.exception("%s[%s]: could not check the stored result", task.name, run.task_id)
    raise Ignore


class RunScope(Scope):
    """Held while the body executes."""

    name = "run"


class QueueScope(Scope):
    """Held from ``apply_async`` until the run of that message ends."""

    name = "queue"
    at_publish = True
    drops_finished = True

    def claim(self, task_id: str, options: LockOptions) -> str | None:
        return queue_token(task_id, options.limit)

    def carried_key(self, run_key: str | None) -> str | None:
        return run_key

    def admit(self, run: Run) -> bool:
        """A copy of a message whose first delivery finished does not run, and completes
        nothing either (``Ignore``: the first delivery's result stays, and a chain or chord
        it belongs to does not go on a second time). Asked of every delivery, not only of
        those the broker marks as redelivered: a message can be published twice. The try of
        the lock asked already when it could (scripting): then nothing is left to ask."""
        if not run.lock.checks_finished and finished(run.lock, run.task_id):
            run.lock.release()
            drop_late_copy(run, "an earlier delivery of it finished")
        return True

    def finished_copy(self, run: Run) -> Any:
        drop_late_copy(run, "an earlier delivery of it finished")

    def retried(self, ending: Release) -> bool:
        return ending.lock.fencing_token is None  # the retried message took the hold over

    def finished_keep(self, options: LockOptions) -> float | None:
        return options.queue_timeout

    def hand_back(self, run: Run) -> None:
        """The hold goes back to the run's message, as a queued hold under the message's
        token (fencing token kept), so a duplicate published while the message waits still
        finds it; released instead when that fails."""
        try:
            if run.queued_lock().acquire(blocking=False):
                run.lock.detach()
                return
        except LockBackendError as exc:
            log.warning("could not hand lock %s back to its message: %s", run.key, exc)
        run.give_back()
