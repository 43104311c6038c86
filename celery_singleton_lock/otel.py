"""OpenTelemetry spans of the locks, fed by the package's signals (the ``otel`` extra:
``pip install 'celery-singleton-lock[otel]'``, which brings ``opentelemetry-api``; your
application brings the SDK and, usually, ``opentelemetry-instrumentation-celery``).

In the module that defines your Celery app::

    from celery_singleton_lock import otel

    otel.install(app)   # spans for the locks of this app's tasks, in every process

Every locked run gets up to two spans, children of the span that is current when the lock
signals are sent: in a worker traced by ``opentelemetry-instrumentation-celery``, its
``run/<task name>`` span (without one they are roots of their own traces):

``lock.acquire``
    From the run's first try at its key to the outcome (``lock.outcome``): ``acquired``,
    ``waited-and-acquired``, ``skipped``, ``retried``, ``raised``, ``timed-out`` (a
    ``wait`` that ran out of ``lock_wait``), ``throttled``; for the outcomes of a call that
    publishes nothing or a message that ends without running, ``coalesced``,
    ``superseded``, ``debounced`` (and ``skipped`` / ``raised`` of a queue-scope publish,
    sent in the producer). A wait carries a ``lock.conflict`` event when it starts (and
    ``lock.throttled`` when the key's rate held it back).
``lock.hold``
    From acquiring the key to releasing it, with its fencing token; ``lock.renewed``
    events as the lease is extended, a ``lock.lost`` event (and an error status) when the
    lease was lost while the body ran.

The spans are made from the signals alone, so tracing changes nothing on the lock's path:
an outcome known only at its end (a wait) becomes a span whose start is set back by the
time waited. The hold span is not made current, so the body's own spans are its siblings.
``celery locks reap`` makes a ``lock.reap`` span per hold it frees.

Attributes (absent when unknown): ``lock.key``, ``lock.outcome``, ``lock.policy``,
``lock.scope``, ``lock.fencing_token``, ``lock.holder_task_id``, ``lock.queue_position``,
``lock.waited``, ``lock.held``, ``lock.renewals``, ``lock.state``, ``lock.released``,
``lock.lost``, ``lock.hold_after``, ``lock.rate``, ``lock.retry_in``, ``lock.superseded_by``,
``lock.running``, ``lock.generation``, ``lock.why``, ``celery.task_name``,
``celery.task_id``.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from celery import Celery
from celery import signals as celery_signals
from celery.utils.dispatch import Signal

from celery_singleton_lock._observe import (
    lock_acquired,
    lock_coalesced,
    lock_conflict,
    lock_debounced,
    lock_lost,
    lock_parked,
    lock_reaped,
    lock_released,
    lock_renewed,
    lock_superseded,
    lock_throttled,
)
from celery_singleton_lock._version import __version__
from celery_singleton_lock.modes import REPORTED
from celery_singleton_lock.modes.base import Mode

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, TracerProvider
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "celery_singleton_lock.otel needs opentelemetry-api: "
        "pip install 'celery-singleton-lock[otel]'"
    ) from exc

__all__ = [
    "ACQUIRE_SPAN",
    "HOLD_SPAN",
    "OUTCOMES",
    "REAP_SPAN",
    "install",
    "uninstall",
]

#: The span of a run's (or a call's) attempt at its key, ending with its outcome.
ACQUIRE_SPAN = "lock.acquire"
#: The span of a hold: from acquiring the key to releasing it.
HOLD_SPAN = "lock.hold"
#: The span of a hold freed by ``celery locks reap``.
REAP_SPAN = "lock.reap"
#: Every value of ``lock.outcome``.
OUTCOMES = (
    "acquired",
    "waited-and-acquired",
    "skipped",
    "retried",
    "raised",
    "timed-out",
    "throttled",
    "coalesced",
    "superseded",
    "debounced",
    "parked",
    "reaped",
)
#: At most this many waits and holds are followed per process (older ones are dropped).
_MAX_FOLLOWED = 10_000

_guard = threading.Lock()
#: The tracer of each app installed; ``_every_app`` is the one of ``install()`` without app.
_apps: weakref.WeakKeyDictionary[Celery, Tracer] = weakref.WeakKeyDictionary()
_every_app: Tracer | None = None
_postrun_connected = False

Attributes = dict[str, str | bool | int | float]
Event = tuple[str, Attributes, int]
Followed = tuple[str, str]  # (task id, lock key)


@dataclass
class _Waiting:
    """A run that started waiting (for its key's holder, or for its key's rate): its span
    is made when the wait ends, with the outcome."""

    tracer: Tracer
    started: int  # ns since the epoch
    parent: otel_context.Context
    attributes: Attributes
    events: list[Event] = field(default_factory=list)
    for_holder: bool = False
    throttled: bool = False
    parking: bool = False


@dataclass
class _Holding:
    """A hold's live span."""

    span: Span
    parent: otel_context.Context


_waiting: dict[Followed, _Waiting] = {}
_holding: dict[Followed, _Holding] = {}


def _app_of(sender: Any) -> Any:
    """The app of a signal's sender: the task's app, or the sender itself when it is one."""
    if isinstance(sender, Celery):
        return sender
    try:
        return getattr(sender, "app", None)
    except Exception:  # noqa: BLE001 - a task without an app sends no span, and fails nothing
        return None


def _tracer_for(sender: Any) -> Tracer | None:
    """The tracer to make ``sender``'s spans with; None when its app is not installed."""
    app = _app_of(sender)
    found = _apps.get(app) if app is not None else None
    return found if found is not None else _every_app


def _attributes(sender: Any, **values: Any) -> Attributes:
    """Span attributes: ``celery.task_name`` (the sending task's), then ``values`` with
    their ``lock.`` prefix (``task_id`` as ``celery.task_id``), leaving out the unknown."""
    found: Attributes = {}
    name = getattr(sender, "name", None) if not isinstance(sender, Celery) else None
    if isinstance(name, str) and name:
        found["celery.task_name"] = name
    for key, value in values.items():
        if value is None:
            continue
        label = "celery.task_id" if key == "task_id" else f"lock.{key}"
        found[label] = value if isinstance(value, (str, bool, int, float)) else str(value)
    return found


def _now() -> int:
    return time.time_ns()


def _seconds_before(now: int, seconds: Any) -> int:
    """``now`` set back by ``seconds`` (when that is a number)."""
    if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and seconds > 0:
        return now - int(seconds * 1e9)
    return now


def _emit(
    tracer: Tracer,
    name: str,
    attributes: Attributes,
    *,
    start: int,
    end: int,
    parent: otel_context.Context | None = None,
    events: list[Event] | None = None,
    error: str | None = None,
) -> None:
    """Make one finished span (``parent`` None: a child of the current span)."""
    span = tracer.start_span(
        name, context=parent, kind=SpanKind.INTERNAL, attributes=attributes, start_time=start
    )
    for event, values, at in events or ():
        span.add_event(event, values, timestamp=at)
    if error is not None:
        span.set_status(Status(StatusCode.ERROR, error))
    span.end(end_time=max(start, end))


def _outcome(
    tracer: Tracer,
    attributes: Attributes,
    outcome: str,
    *,
    now: int,
    started: int | None = None,
    waiting: _Waiting | None = None,
    error: str | None = None,
) -> None:
    """The ``lock.acquire`` span of an attempt that ended now in ``outcome`` (continuing the
    wait ``waiting``, if the attempt waited)."""
    attributes = {**attributes, "lock.outcome": outcome}
    parent, events = None, None
    if waiting is not None:
        attributes = {**waiting.attributes, **attributes}
        started = min(started or now, waiting.started)
        parent, events = waiting.parent, waiting.events
    _emit(
        tracer,
        ACQUIRE_SPAN,
        attributes,
        start=started if started is not None else now,
        end=now,
        parent=parent,
        events=events,
        error=error,
    )


def _follow(table: dict[Followed, Any], key: Followed, value: Any) -> None:
    """Remember ``value`` under ``key`` (bounded: the oldest entry goes first)."""
    with _guard:
        if len(table) >= _MAX_FOLLOWED:
            table.pop(next(iter(table)))
        table[key] = value


def _unfollow(table: dict[Followed, Any], key: Followed) -> Any:
    with _guard:
        return table.pop(key, None)


def _settled_by(policy: str | None) -> type[Mode] | None:
    """The policy (or mode) that a signal's ``policy`` names; None when it names none."""
    return REPORTED.get(str(policy))


def _conflict_outcome(policy: str | None) -> tuple[str, bool]:
    """(``lock.outcome``, whether the caller fails) of a conflict settled by ``policy``."""
    kind = _settled_by(policy)
    if kind is None or kind.outcome is None:
        return str(policy), False
    return kind.outcome, kind.fails_caller


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


_RECEIVERS: Mapping[Signal, Callable[..., None]] = {
    lock_conflict: _on_conflict,
    lock_throttled: _on_throttled,
    lock_acquired: _on_acquired,
    lock_renewed: _on_renewed,
    lock_lost: _on_lost,
    lock_released: _on_released,
    lock_coalesced: _outcome_receiver("coalesced", scope="scope"),
    lock_superseded: _outcome_receiver("superseded", by="superseded_by", running="running"),
    lock_debounced: _outcome_receiver("debounced", generation="generation"),
    lock_parked: _on_parked,
    lock_reaped: _on_reaped,
}


def _uid(signal: Signal) -> str:
    return f"csl.otel.{getattr(signal, 'name', id(signal))}"


def install(app: Celery | None = None, *, tracer_provider: TracerProvider | None = None) -> None:
    """Make spans for the locks of ``app``'s tasks (of every app's, when ``app`` is None)
    from now on, in this process and in the processes forked from it: call it in the module
    that defines the app, which every worker imports. The tracer comes from
    ``tracer_provider``, else from the global provider (looked up when a span is made, so
    setting the provider later, in ``worker_process_init``, is fine). Idempotent."""
    global _every_app  # noqa: PLW0603 - one set of receivers per process
    tracer = trace.get_tracer("celery_singleton_lock", __version__, tracer_provider)
    with _guard:
        if app is None:
            _every_app = tracer
        else:
            _apps[app] = tracer
    for signal, receiver in _RECEIVERS.items():
        signal.connect(receiver, weak=False, dispatch_uid=_uid(signal))


def uninstall(app: Celery | None = None) -> None:
    """Stop making spans for ``app``'s tasks (``None``: undo ``install()`` without an app).
    The receivers stay connected (they cost a lookup) until no app is left; then the waits
    and holds still open are dropped without a span."""
    global _every_app  # noqa: PLW0603 - one set of receivers per process
    with _guard:
        if app is None:
            _every_app = None
        else:
            _apps.pop(app, None)
        left = _every_app is not None or len(_apps) > 0
    if not left:
        for signal in _RECEIVERS:
            signal.disconnect(dispatch_uid=_uid(signal))
        with _guard:  # what was followed will never end: drop it, unexported
            _waiting.clear()
            _holding.clear()
