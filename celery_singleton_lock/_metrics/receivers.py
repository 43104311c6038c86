"""The signal receivers of :mod:`celery_singleton_lock.metrics`: each lock or beat signal
counts in the metrics of the registry enabled last (:func:`enable`)."""

from __future__ import annotations

import threading
from typing import Any

from celery import Task
from prometheus_client import REGISTRY, CollectorRegistry

from celery_singleton_lock import _observe as observe
from celery_singleton_lock._metrics.objects import (
    POLICY_LABELS,
    SCOPE_LABELS,
    UNKNOWN,
    LockMetrics,
)

_guard = threading.Lock()
#: The metrics of each registry enabled, by ``id``; the registry is kept with them, so its
#: ``id`` cannot be reused by another registry while the entry exists.
_enabled: dict[int, tuple[CollectorRegistry, LockMetrics]] = {}
_current: LockMetrics | None = None


def _task_name(sender: Any) -> str:
    """The ``task`` label: the sending task's name, else ``unknown`` (never a repr, which
    would carry a memory address and make a new series per process)."""
    name = getattr(sender, "name", None) if isinstance(sender, Task) else None
    return name if isinstance(name, str) and name else UNKNOWN


def _one_of(value: Any, allowed: frozenset[str]) -> str:
    """``value`` when it is one of ``allowed``, else ``unknown``."""
    return value if isinstance(value, str) and value in allowed else UNKNOWN


def _on_acquired(sender: Any = None, scope: str = "", waited: float = 0.0, **_: Any) -> None:
    if _current is not None:
        _current.acquired.labels(_task_name(sender), _one_of(scope, SCOPE_LABELS)).inc()
        _current.wait.labels(_task_name(sender)).observe(waited)


def _on_conflict(sender: Any = None, policy: str = "", **_: Any) -> None:
    if _current is not None:
        _current.conflicts.labels(_task_name(sender), _one_of(policy, POLICY_LABELS)).inc()


def _on_released(sender: Any = None, held: float | None = None, **_: Any) -> None:
    if _current is not None and held is not None:
        _current.held.labels(_task_name(sender)).observe(held)


def _on_lost(sender: Any = None, **_: Any) -> None:
    if _current is not None:
        _current.lost.labels(_task_name(sender)).inc()


def _on_renewed(sender: Any = None, **_: Any) -> None:
    if _current is not None:
        _current.renewals.labels(_task_name(sender)).inc()


def _on_throttled(sender: Any = None, policy: str = "", **_: Any) -> None:
    if _current is not None:
        _current.throttled.labels(_task_name(sender), _one_of(policy, POLICY_LABELS)).inc()


def _counting(name: str) -> Any:
    """A receiver that counts one of the outcome metrics by task."""

    def receive(sender: Any = None, **_: Any) -> None:
        if _current is not None:
            getattr(_current, name).labels(_task_name(sender)).inc()

    return receive


def _on_superseded(sender: Any = None, **_: Any) -> None:
    # Counted once: where the superseding call is made, not again when the superseded
    # message is delivered to a worker.
    request: Any = getattr(sender, "request", None)
    delivered = bool(getattr(request, "hostname", None)) and not getattr(request, "is_eager", True)
    if _current is not None and not delivered:
        _current.superseded.labels(_task_name(sender)).inc()


def _on_beat_elected(**_: Any) -> None:
    if _current is not None:
        _current.beat_elected.inc()


def _on_beat_deposed(**_: Any) -> None:
    if _current is not None:
        _current.beat_deposed.inc()


def _beat_slots(outcome: str) -> Any:
    """A receiver that counts beat slots of one outcome (``count`` of them when sent)."""

    def receive(count: int = 1, caught_up: bool = False, **_: Any) -> None:
        if _current is None:
            return
        if outcome == "sent" and caught_up:
            return  # counted as caught_up
        _current.beat_slots.labels(outcome).inc(max(0, int(count)))

    return receive


def enable(registry: CollectorRegistry | None = None) -> LockMetrics:
    """Count lock events in ``registry`` (default: ``prometheus_client``'s ``REGISTRY``) from
    now on, in this process and in processes forked from it. Idempotent per registry; the
    last registry enabled is the one counted in."""
    global _current  # noqa: PLW0603 - one set of metric objects per process
    target = REGISTRY if registry is None else registry
    with _guard:
        entry = _enabled.get(id(target))
        if entry is None:
            entry = _enabled[id(target)] = (target, LockMetrics.create(target))
        found = entry[1]
        _current = found
        for signal, receiver in (
            (observe.lock_acquired, _on_acquired),
            (observe.lock_conflict, _on_conflict),
            (observe.lock_released, _on_released),
            (observe.lock_lost, _on_lost),
            (observe.lock_renewed, _on_renewed),
            (observe.lock_throttled, _on_throttled),
            (observe.lock_coalesced, _counting("coalesced")),
            (observe.lock_superseded, _on_superseded),
            (observe.lock_debounced, _counting("debounced")),
            (observe.lock_reaped, _counting("reaped")),
            (observe.lock_parked, _counting("parked")),
            (observe.lock_unparked, _counting("unparked")),
            (observe.beat_elected, _on_beat_elected),
            (observe.beat_deposed, _on_beat_deposed),
            (observe.beat_slot_sent, _beat_slots("sent")),
            (observe.beat_slot_caught_up, _beat_slots("caught_up")),
            (observe.beat_slot_skipped, _beat_slots("skipped")),
            (observe.beat_slots_missed, _beat_slots("missed")),
        ):
            uid = f"csl.metrics.{getattr(signal, 'name', id(signal))}"
            signal.connect(receiver, weak=False, dispatch_uid=uid)
    return found
