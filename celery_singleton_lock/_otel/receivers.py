"""The signal receivers of :mod:`celery_singleton_lock.otel`: each lock signal continues
or ends the spans of its run (see :mod:`.spans` for what is followed)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from celery import signals as celery_signals
from celery.utils.dispatch import Signal
from opentelemetry import context as otel_context
from opentelemetry.trace import SpanKind, Status, StatusCode

from celery_singleton_lock import _observe as observe
from celery_singleton_lock._otel.spans import (
    HOLD_SPAN,
    REAP_SPAN,
    _attributes,
    _conflict_outcome,
    _emit,
    _follow,
    _guard,
    _Holding,
    _holding,
    _now,
    _outcome,
    _seconds_before,
    _settled_by,
    _tracer_for,
    _unfollow,
    _Waiting,
    _waiting,
)

_postrun_connected = False


def _connect_postrun() -> None:
    """Connect the ``task_postrun`` receiver that ends what a run left open, once, and after
    the package's own (which may still release a hold there)."""
    global _postrun_connected  # noqa: PLW0603 - one receiver per process
    if not _postrun_connected:
        _postrun_connected = True
        celery_signals.task_postrun.connect(
            _on_postrun, weak=False, dispatch_uid="csl.otel.postrun"
        )


# -- the receivers ---------------------------------------------------------------------------


def _on_conflict(
    sender: Any = None,
    *,
    key: str | None = None,
    task_id: str | None = None,
    holder_task_id: str | None = None,
    policy: str | None = None,
    scope: str | None = None,
    **extra: Any,
) -> None:
    tracer = _tracer_for(sender)
    if tracer is None or key is None:
        return
    now = _now()
    attributes = _attributes(
        sender,
        key=key,
        task_id=task_id,
        policy=policy,
        scope=scope,
        holder_task_id=holder_task_id,
        queue_position=extra.get("position"),
    )
    started = _seconds_before(now, extra.get("waited"))
    kind = _settled_by(policy)
    later = kind is not None and kind.outcome is None  # a signal of its own ends it
    if task_id is None:
        # A publish: coalesce and replace end in lock_coalesced / lock_superseded, next.
        if not later:
            outcome, fails = _conflict_outcome(policy)
            error = "the key is queued or running" if fails else None
            _outcome(tracer, attributes, outcome, now=now, started=started, error=error)
        return
    _connect_postrun()
    if kind is not None and kind.waits:
        waiting = _unfollow(_waiting, (task_id, key)) or _Waiting(
            tracer, started, otel_context.get_current(), {}
        )
        waiting.attributes.update(attributes)
        waiting.for_holder = True
        conflict = {k: v for k, v in attributes.items() if k == "lock.holder_task_id"}
        waiting.events.append(("lock.conflict", conflict, now))
        _follow(_waiting, (task_id, key), waiting)
        return
    if later:
        # A run that a stacked limit held back under park: lock_parked, next, ends its
        # try (one span); should it come back at once instead, the run's end says so.
        pending = _Waiting(tracer, started, otel_context.get_current(), attributes)
        pending.parking = True
        _follow(_waiting, (task_id, key), pending)
        return
    waiting = _unfollow(_waiting, (task_id, key))
    outcome, fails = _conflict_outcome(policy)
    error = "the key is held" if fails else None
    _outcome(tracer, attributes, outcome, now=now, started=started, waiting=waiting, error=error)


def _on_throttled(
    sender: Any = None,
    *,
    key: str | None = None,
    task_id: str | None = None,
    policy: str | None = None,
    scope: str | None = None,
    rate: str | None = None,
    retry_in: float | None = None,
    **extra: Any,
) -> None:
    tracer = _tracer_for(sender)
    if tracer is None or key is None or task_id is None:
        return
    _connect_postrun()
    now = _now()
    attributes = _attributes(
        sender, key=key, task_id=task_id, policy=policy, scope=scope, rate=rate, retry_in=retry_in
    )
    waiting = _unfollow(_waiting, (task_id, key))
    kind = _settled_by(policy)
    if kind is not None and kind.waits:  # it sleeps until its rate admits it, holding the key
        if waiting is None:
            started = _seconds_before(now, extra.get("waited"))
            waiting = _Waiting(tracer, started, otel_context.get_current(), {})
        waiting.attributes.update(attributes)
        waiting.throttled = True
        throttled = {k: v for k, v in attributes.items() if k in ("lock.rate", "lock.retry_in")}
        waiting.events.append(("lock.throttled", throttled, now))
        _follow(_waiting, (task_id, key), waiting)
        return
    error = "the key's rate is used up" if kind is not None and kind.fails_caller else None
    started = _seconds_before(now, extra.get("waited"))
    _outcome(
        tracer, attributes, "throttled", now=now, started=started, waiting=waiting, error=error
    )


def _on_acquired(
    sender: Any = None,
    *,
    key: str | None = None,
    task_id: str | None = None,
    fencing_token: int | None = None,
    waited: float | None = None,
    policy: str | None = None,
    scope: str | None = None,
    **extra: Any,
) -> None:
    tracer = _tracer_for(sender)
    if tracer is None or key is None or task_id is None:
        return
    _connect_postrun()
    now = _now()
    attributes = _attributes(
        sender,
        key=key,
        task_id=task_id,
        policy=policy,
        scope=scope,
        fencing_token=fencing_token,
        queue_position=extra.get("position"),
    )
    waiting = _unfollow(_waiting, (task_id, key))
    outcome = "waited-and-acquired" if waiting is not None else "acquired"
    acquire = {**attributes, "lock.waited": float(waited or 0.0)}
    _outcome(
        tracer, acquire, outcome, now=now, started=_seconds_before(now, waited), waiting=waiting
    )
    parent = waiting.parent if waiting is not None else otel_context.get_current()
    span = tracer.start_span(
        HOLD_SPAN, context=parent, kind=SpanKind.INTERNAL, attributes=attributes, start_time=now
    )
    _follow(_holding, (task_id, key), _Holding(span, parent))


def _on_renewed(
    sender: Any = None,
    *,
    key: str | None = None,
    task_id: str | None = None,
    fencing_token: int | None = None,
    **_: Any,
) -> None:
    with _guard:
        holding = _holding.get((str(task_id), str(key)))
    if holding is not None:
        renewed = {"lock.fencing_token": fencing_token} if fencing_token is not None else {}
        holding.span.add_event("lock.renewed", renewed)


def _on_lost(
    sender: Any = None,
    *,
    key: str | None = None,
    task_id: str | None = None,
    held: float | None = None,
    renewals: int | None = None,
    **_: Any,
) -> None:
    with _guard:
        holding = _holding.get((str(task_id), str(key)))
    if holding is None:
        return
    lost = _attributes(None, held=held, renewals=renewals)
    holding.span.add_event("lock.lost", lost)
    holding.span.set_attribute("lock.lost", True)
    holding.span.set_status(Status(StatusCode.ERROR, "the lease was lost while the body ran"))


def _on_released(
    sender: Any = None,
    *,
    key: str | None = None,
    task_id: str | None = None,
    held: float | None = None,
    renewals: int | None = None,
    state: str | None = None,
    hold: float | None = None,
    **_: Any,
) -> None:
    holding = _unfollow(_holding, (str(task_id), str(key)))
    if holding is None:
        return
    ended = _attributes(None, held=held, renewals=renewals, state=state, released=True)
    if hold:
        ended["lock.hold_after"] = float(hold)
    holding.span.set_attributes(ended)
    holding.span.end(end_time=_now())


def _on_postrun(
    sender: Any = None, *, task_id: str | None = None, state: str | None = None, **_: Any
) -> None:
    """The run ended: a wait that never got its key (``lock_wait`` ran out, or its rate
    stayed used up) gets its span, and a hold that was not released (a lease lost and taken
    by another run; a queue-scope retry that handed it to its next message) ends."""
    if task_id is None:
        return
    now = _now()
    with _guard:
        waits = [_waiting.pop(k) for k in [k for k in _waiting if k[0] == task_id]]
        holds = [_holding.pop(k) for k in [k for k in _holding if k[0] == task_id]]
    for waiting in waits:
        if waiting.parking:  # its limits had room after all: it came back at once
            _outcome(waiting.tracer, {}, "retried", now=now, waiting=waiting)
            continue
        if waiting.for_holder:
            outcome, error = "timed-out", "lock_wait ran out"
        else:
            outcome, error = "throttled", "the key's rate is used up"
        _outcome(waiting.tracer, {}, outcome, now=now, waiting=waiting, error=error)
    for holding in holds:
        holding.span.set_attributes(_attributes(None, state=state, released=False))
        holding.span.end(end_time=now)


def _outcome_receiver(outcome: str, **names: str) -> Callable[..., None]:
    """A receiver of a signal that is itself an outcome: one ``lock.acquire`` span, its
    keyword arguments ``names`` as attributes (``{keyword: attribute name}``)."""

    def receive(
        sender: Any = None, *, key: str | None = None, task_id: str | None = None, **kwargs: Any
    ) -> None:
        tracer = _tracer_for(sender)
        if tracer is None or key is None:
            return
        values = {names[k]: v for k, v in kwargs.items() if k in names}
        attributes = _attributes(sender, key=key, task_id=task_id, **values)
        _outcome(tracer, attributes, outcome, now=_now())

    return receive


def _on_parked(
    sender: Any = None,
    *,
    key: str | None = None,
    task_id: str | None = None,
    position: int | None = None,
    scope: str | None = None,
    **_: Any,
) -> None:
    """A call parked: the end of its try, continuing its conflict when one began it."""
    tracer = _tracer_for(sender)
    if tracer is None or key is None:
        return
    attributes = _attributes(sender, key=key, task_id=task_id, queue_position=position, scope=scope)
    waiting = _unfollow(_waiting, (task_id, key)) if task_id is not None else None
    _outcome(tracer, attributes, "parked", now=_now(), waiting=waiting)


def _on_reaped(
    sender: Any = None,
    *,
    key: str | None = None,
    task_id: str | None = None,
    why: str | None = None,
    **_: Any,
) -> None:
    tracer = _tracer_for(sender)
    if tracer is None or key is None:
        return
    now = _now()
    attributes = _attributes(sender, key=key, holder_task_id=task_id, why=why, outcome="reaped")
    _emit(tracer, REAP_SPAN, attributes, start=now, end=now)


RECEIVERS: Mapping[Signal, Callable[..., None]] = {
    observe.lock_conflict: _on_conflict,
    observe.lock_throttled: _on_throttled,
    observe.lock_acquired: _on_acquired,
    observe.lock_renewed: _on_renewed,
    observe.lock_lost: _on_lost,
    observe.lock_released: _on_released,
    observe.lock_coalesced: _outcome_receiver("coalesced", scope="scope"),
    observe.lock_superseded: _outcome_receiver("superseded", by="superseded_by", running="running"),
    observe.lock_debounced: _outcome_receiver("debounced", generation="generation"),
    observe.lock_parked: _on_parked,
    observe.lock_reaped: _on_reaped,
}
