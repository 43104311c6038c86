"""The span bookkeeping of :mod:`celery_singleton_lock.otel`: the tracer of each app
installed, the waits and holds followed per process, and the making of finished spans."""

from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from celery import Celery
from opentelemetry import context as otel_context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from celery_singleton_lock.modes import REPORTED
from celery_singleton_lock.modes.base import Mode

#: The span of a run's (or a call's) attempt at its key, ending with its outcome.
ACQUIRE_SPAN = "lock.acquire"
#: The span of a hold: from acquiring the key to releasing it.
HOLD_SPAN = "lock.hold"
#: The span of a hold freed by ``celery locks reap``.
REAP_SPAN = "lock.reap"

#: At most this many waits and holds are followed per process (older ones are dropped).
_MAX_FOLLOWED = 10_000

_guard = threading.Lock()
#: The tracer of each app installed; ``_every_app`` is the one of ``install()`` without app.
_apps: weakref.WeakKeyDictionary[Celery, Tracer] = weakref.WeakKeyDictionary()
_every_app: Tracer | None = None

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


def set_tracer(app: Celery | None, tracer: Tracer | None) -> bool:
    """Make spans of ``app``'s tasks with ``tracer`` (``app`` None: of every app's; ``tracer``
    None: stop). Whether any app is left installed."""
    global _every_app  # noqa: PLW0603 - one set of tracers per process
    with _guard:
        if app is None:
            _every_app = tracer
        elif tracer is None:
            _apps.pop(app, None)
        else:
            _apps[app] = tracer
        return _every_app is not None or len(_apps) > 0


def forget() -> None:
    """Drop the waits and holds still followed, unexported: they will never end."""
    with _guard:
        _waiting.clear()
        _holding.clear()
