"""``lock_order="enqueue"``: the calls of one key run in the order of their ``apply_async``.

At publish a call takes its turn in the key's line in the lock Redis (the key's counter,
behind every call of a higher Celery priority) and its message carries it. At delivery the
call's turn is checked: one of the first ``lock_limit`` outstanding calls of the key goes
ahead; any other parks (it needs ``lock_on_conflict="park"``) and is handed the key when
the calls before it are done, each leaving the line in the step that releases its key. A
call with a countdown or ETA takes no turn at publish: it takes one when its time comes, so
it never holds up the calls behind it. In queue scope the key is taken at publish and a
call whose key is held parks there, at its turn. A call whose message never comes (lost, or waiting
longer than ``lock_queue_timeout``) and a run whose worker died (after its lease) stop
holding up the line.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, ClassVar

from celery.exceptions import Ignore
from celery.utils import uuid

from celery_singleton_lock.engine import atomic
from celery_singleton_lock.exceptions import LockBackendError
from celery_singleton_lock.modes.base import Mode
from celery_singleton_lock.modes.park import Park
from celery_singleton_lock.modes.parking import (
    HEADER_PARKED,
    HEADER_TURN,
    ordered,
    priority_rank,
    take_turn,
    turn_of,
)
from celery_singleton_lock.modes.scope import drop_late_copy
from celery_singleton_lock.options import Combination

if TYPE_CHECKING:
    from celery_singleton_lock.engine.wire import LockClient
    from celery_singleton_lock.modes.base import AnyResult, Publish, Run
    from celery_singleton_lock.options import LockOptions

__all__ = ["Order"]

log = logging.getLogger("celery_singleton_lock.task")

#: A run that went ahead keeps its place this much longer than its lease (seconds).
_PLACE_SLACK = 1.0
_PARK = Park()


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


class Order(Mode):
    """``lock_order="enqueue"``."""

    name = "order"
    rules: ClassVar[tuple[Combination, ...]] = (
        Combination(
            lambda o, _: ordered(o) and o.on_conflict != "park",
            "lock_order='enqueue' needs lock_on_conflict='park' (a message delivered ahead "
            "of its turn parks until the calls before it are done)",
        ),
    )

    @classmethod
    def applies(cls, options: LockOptions) -> bool:
        return ordered(options) and options.on_conflict == "park"

    def before_publish(self, call: Publish) -> AnyResult | None:
        """Take the call's turn and put it in its message; a call with a countdown or ETA
        takes its turn when its time comes."""
        sent = call.publish_options
        headers = dict(sent.get("headers") or {})
        if sent.get("countdown") or sent.get("eta") or HEADER_TURN in headers:
            return None
        task = call.task
        if task.app.conf.task_always_eager:
            return None
        task_id = sent.get("task_id") or uuid()
        priority = sent.get("priority", getattr(task, "priority", None))
        try:
            turn = take_turn(
                call.client,
                call.key(),
                task_id,
                options=call.options,
                rank=priority_rank(task.app, priority),
            )
        except LockBackendError as exc:
            log.warning(
                "%s[%s]: could not take a turn in the line of its key (%s); it takes "
                "one when it is delivered",
                task.name,
                task_id,
                exc,
            )
            return None
        sent["task_id"] = task_id
        sent["headers"] = {**headers, HEADER_TURN: turn}
        return None

    def deliver(self, run: Run) -> None:
        """Go ahead when the call's turn has come; else park until it has; a copy of a call
        that finished is dropped."""
        if run.eager or run.header(HEADER_PARKED):  # a handed-off call's turn has come
            return
        if run.scope.at_publish:  # it holds its key since its publish, which was in turn
            return
        turn = turn_of(run)
        if turn is None:
            return
        options = run.options
        verdict = atomic.order_turn(
            run.client,
            run.key,
            run.task_id,
            turn=turn,
            slots=options.limit,
            keep_ms=_ms(options.queue_timeout),
            lease_ms=_ms(options.timeout + _PLACE_SLACK),
        )
        if verdict < 0:
            drop_late_copy(run, f"a copy of a call that finished under {run.key}")
        if verdict == 0 and _PARK.park_run(run, turn):
            raise Ignore

    def finished_keep(self, options: LockOptions) -> float | None:
        return options.queue_timeout  # a late copy of a call that ran is dropped

    def forget(self, client: LockClient, key: str, task_id: str) -> None:
        """A call that will never run does not hold up the calls behind it in the line."""
        atomic.order_leave(client, key, task_id)
