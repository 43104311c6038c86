"""``lock_debounce=T`` (with ``lock_debounce_max_wait=M``): calls of one key closer than T apart
form a burst that runs once, T after its last call (at the latest M after its first), with
the last call's arguments; every call of the burst gets the same ``AsyncResult``.

It is decided in Redis when the call is made. A burst is a hash beside the lock key
(``keyspace.DEBOUNCE``): its task id, a generation (bumped by every call) and the time its
run is due (server clock). Every call publishes a message under the burst's task id,
carrying its generation, with a countdown to the due time. When a message is delivered, one
script compares its generation with the burst's: the latest one marks the burst as run and
runs (under the task's lock, as any run; a second delivery of it does not run again); an
older one ends without running (``Ignore``: no result is stored, so the burst's
``AsyncResult`` gets the real run's). A call made once the burst is due starts a new burst.
Nothing here relies on ``revoke`` (which lives in worker memory).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, ClassVar

from celery.exceptions import Ignore
from celery.utils import uuid

from celery_singleton_lock import _observe as observe
from celery_singleton_lock.engine import atomic
from celery_singleton_lock.modes.base import Mode
from celery_singleton_lock.modes.policies import refuse_in_canvas
from celery_singleton_lock.options import Combination, no_scripts

if TYPE_CHECKING:
    from celery_singleton_lock.modes.base import AnyResult, Publish, Run
    from celery_singleton_lock.options import LockOptions

__all__ = ["HEADER_DEBOUNCE", "Debounce"]

log = logging.getLogger("celery_singleton_lock.task")

#: Message header with the burst generation a debounced call published.
HEADER_DEBOUNCE = "singleton_lock_debounce"
#: A burst's record outlives its due time by this much (its run reads it when it starts).
KEEP_MS = 3_600_000


class Debounce(Mode):
    """``lock_debounce`` and ``lock_debounce_max_wait``."""

    name = reported = "debounce"
    outcome = "debounced"
    rules: ClassVar[tuple[Combination, ...]] = (
        Combination(
            lambda o, _: o.debounce_max_wait is not None and o.debounce is None,
            "lock_debounce_max_wait needs lock_debounce (it caps how long a burst is put off)",
        ),
        Combination(
            lambda o, _: (
                o.debounce is not None
                and o.debounce_max_wait is not None
                and o.debounce_max_wait < o.debounce
            ),
            "lock_debounce_max_wait must be at least lock_debounce",
        ),
        Combination(
            lambda o, s: o.debounce is not None and no_scripts(s),
            "lock_debounce needs Lua scripts (a burst is decided by scripts), which "
            "singleton_lock_scripting=False turns off",
        ),
    )

    @classmethod
    def applies(cls, options: LockOptions) -> bool:
        return options.debounce is not None

    def finished_keep(self, options: LockOptions) -> float | None:
        return KEEP_MS / 1000  # a finished burst never runs again, whatever comes late

    def before_publish(self, call: Publish) -> AnyResult | None:
        """The call joins its key's burst and is published under the burst's task id, due
        when the burst is; the lock is taken when that run starts. A retry of a run (its own
        ``self.retry()``) is that run again, published as asked (its countdown kept)."""
        options = call.options
        publish_options = call.publish_options
        if publish_options.get("retries"):
            return None
        key = call.key()
        refuse_in_canvas(call, key, None, "only the last call of its debounce burst runs")
        task_id = publish_options.pop("task_id", None) or uuid()
        for timing in ("countdown", "eta"):
            publish_options.pop(timing, None)
        burst = atomic.debounce_join(
            call.client,
            key,
            task_id,
            quiet_ms=max(1, round((options.debounce or 0.0) * 1000)),
            max_wait_ms=round((options.debounce_max_wait or 0) * 1000),
            keep_ms=KEEP_MS,
        )
        if burst.generation > 1:
            observe.conflict(
                call.task,
                key,
                None,
                policy="debounce",
                scope=options.scope,
                holder_task_id=burst.task_id,
            )
        return call.send(
            task_id=burst.task_id,
            countdown=burst.countdown,
            keyed=True,
            headers={HEADER_DEBOUNCE: burst.generation},
        )

    def deliver(self, run: Run) -> None:
        """A message of a burst runs only if it is the burst's latest call and the burst has
        not finished; an older one ends here. The run that goes ahead is the work of every
        call of its burst: a busy key makes it come back later, even under ``skip``."""
        generation = run.header(HEADER_DEBOUNCE)
        if generation is None:
            return
        if atomic.debounce_run(run.client, run.key, run.task_id, str(generation), keep_ms=KEEP_MS):
            run.insist()
            return
        observe.debounced(run.task, run.key, run.task_id, generation=int(generation))
        log.info(
            "%s[%s] not run: debounced (generation %s is stale)",
            run.task.name,
            run.task_id,
            generation,
        )
        raise Ignore
