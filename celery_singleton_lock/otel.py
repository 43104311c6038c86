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

from celery import Celery
from celery.utils.dispatch import Signal

from celery_singleton_lock._version import __version__

try:
    from opentelemetry import trace
    from opentelemetry.trace import TracerProvider
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "celery_singleton_lock.otel needs opentelemetry-api: "
        "pip install 'celery-singleton-lock[otel]'"
    ) from exc

from celery_singleton_lock._otel.receivers import RECEIVERS
from celery_singleton_lock._otel.spans import (
    ACQUIRE_SPAN,
    HOLD_SPAN,
    REAP_SPAN,
    forget,
    set_tracer,
)

__all__ = [
    "ACQUIRE_SPAN",
    "HOLD_SPAN",
    "OUTCOMES",
    "REAP_SPAN",
    "install",
    "uninstall",
]

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


def _uid(signal: Signal) -> str:
    return f"csl.otel.{getattr(signal, 'name', id(signal))}"


def install(app: Celery | None = None, *, tracer_provider: TracerProvider | None = None) -> None:
    """Make spans for the locks of ``app``'s tasks (of every app's, when ``app`` is None)
    from now on, in this process and in the processes forked from it: call it in the module
    that defines the app, which every worker imports. The tracer comes from
    ``tracer_provider``, else from the global provider (looked up when a span is made, so
    setting the provider later, in ``worker_process_init``, is fine). Idempotent."""
    tracer = trace.get_tracer("celery_singleton_lock", __version__, tracer_provider)
    set_tracer(app, tracer)
    for signal, receiver in RECEIVERS.items():
        signal.connect(receiver, weak=False, dispatch_uid=_uid(signal))


def uninstall(app: Celery | None = None) -> None:
    """Stop making spans for ``app``'s tasks (``None``: undo ``install()`` without an app).
    The receivers stay connected (they cost a lookup) until no app is left; then the waits
    and holds still open are dropped without a span."""
    if not set_tracer(app, None):
        for signal in RECEIVERS:
            signal.disconnect(dispatch_uid=_uid(signal))
        forget()  # what was followed will never end: drop it, unexported
