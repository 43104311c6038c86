"""Prometheus metrics of the locks, fed by the package's signals (the ``metrics`` extra:
``pip install 'celery-singleton-lock[metrics]'``, which brings ``prometheus_client``).

In the module that defines your Celery app::

    from celery_singleton_lock import metrics

    metrics.install(app, port=9808)   # count in every process; serve /metrics from workers

Metrics (label ``task`` is the task name; no label ever carries a lock key)::

    celery_singleton_lock_acquired_total{task,scope}      runs that took their lock
    celery_singleton_lock_conflicts_total{task,policy}    runs/publishes that found it held
    celery_singleton_lock_wait_seconds{task}              time from first try to holding it
    celery_singleton_lock_held_seconds{task}              time held, per released run
    celery_singleton_lock_lost_total{task}                leases lost while a body ran
    celery_singleton_lock_renewals_total{task}            lease extensions while held
    celery_singleton_lock_throttled_total{task,policy}    runs that did not start: their key
                                                          used up its lock_rate_limit
    celery_singleton_lock_coalesced_total{task}           calls that became a follow-up
    celery_singleton_lock_superseded_total{task}          queued calls superseded (counted
                                                          where the superseding call is made)
    celery_singleton_lock_debounced_total{task}           stale debounced messages dropped
    celery_singleton_lock_reaped_total{task}              holds freed by `celery locks reap`
    celery_singleton_lock_parked_total{task}              calls parked on a held key
    celery_singleton_lock_unparked_total{task}            parked calls handed their key, started
    celery_singleton_lock_beat_elected_total              beat replicas that became the leader
    celery_singleton_lock_beat_deposed_total              beat leaders that stopped leading
    celery_singleton_lock_beat_slots_total{outcome}       slots of beat entries: sent, caught_up
                                                          (sent late by the catch-up rule),
                                                          skipped (taken already), missed (not
                                                          sent by the catch-up rule)

The beat counters count in the ``celery beat`` process of a ``LeaderScheduler`` replica
(call :func:`enable` where the app is defined; serve them with :func:`serve`).

Gauges of the stacked limits (``lock_limits``), read from the lock Redis at each scrape of a
worker's ``/metrics`` (``install(app, port=...)``; :class:`LimitsCollector`)::

    celery_singleton_lock_limit_in_use{limit}   weight of the live shares of the limit
    celery_singleton_lock_limit_holds{limit}    runs holding a share of it
    celery_singleton_lock_limit_number{limit}   the number that applies now (Redis, else code)

``limit`` is a limit's name (``global:exports``, ``tenant:acme``): at most
``LIMIT_SERIES`` series per gauge, the fullest limits first (a template over an argument
with many values would otherwise make one series per value).

Every label comes from a bounded set, so no series is made per call, key or process:
``task`` is the name of the task that sent the signal, or ``unknown`` when the sender is not
a task (``celery locks reap`` freeing a hold whose task its app does not know sends it from
the app); ``scope`` is ``run`` or ``queue``; ``policy`` is a ``lock_on_conflict`` value or
``debounce``. Anything else is counted as ``unknown``.

**Prefork pools.** Tasks run in pool processes, and each process counts in its own memory.
Set ``PROMETHEUS_MULTIPROC_DIR`` to an empty directory in the worker's environment (before
it starts): every process then writes its counts there, and the server that
:func:`install` starts in the worker's main process adds them up
(``prometheus_client``'s multiprocess mode). Without it, a prefork worker's server would
show nothing of its pool processes, so :func:`install` logs an error at worker start.
"""

from __future__ import annotations

import os
from typing import Any

from celery import bootsteps

try:
    from prometheus_client import REGISTRY, CollectorRegistry
    from prometheus_client import start_http_server as _start_http_server
    from prometheus_client.multiprocess import MultiProcessCollector
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "celery_singleton_lock.metrics needs prometheus_client: "
        "pip install 'celery-singleton-lock[metrics]'"
    ) from exc

# HELD_BUCKETS ... WAIT_BUCKETS, limit_rows: names of this module before its parts moved to
# ``_metrics``, still importable from here.
from celery_singleton_lock._metrics.gauges import (
    LimitsCollector,
    limit_rows,  # noqa: F401
)
from celery_singleton_lock._metrics.objects import (
    HELD_BUCKETS,  # noqa: F401
    LIMIT_GAUGES,  # noqa: F401
    LIMIT_SERIES,
    POLICY_LABELS,  # noqa: F401
    PREFIX,  # noqa: F401
    SCOPE_LABELS,  # noqa: F401
    UNKNOWN,  # noqa: F401
    WAIT_BUCKETS,  # noqa: F401
    LockMetrics,
    Series,
    exposed,
    log,
    reference_markdown,
)
from celery_singleton_lock._metrics.receivers import enable

__all__ = [
    "LIMIT_SERIES",
    "LimitsCollector",
    "LockMetrics",
    "Series",
    "enable",
    "exposed",
    "install",
    "multiprocess_dir",
    "reference_markdown",
    "serve",
]


def multiprocess_dir() -> str | None:
    """The ``PROMETHEUS_MULTIPROC_DIR`` in effect, None when not in multiprocess mode."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def serve(
    port: int,
    addr: str = "0.0.0.0",  # noqa: S104 - prometheus_client's own default
    registry: CollectorRegistry | None = None,
    app: Any = None,
) -> Any:
    """Serve ``/metrics`` on ``addr:port`` from a daemon thread; returns the server (or
    whatever ``prometheus_client.start_http_server`` returns). In multiprocess mode it
    serves the sum over every process that wrote to ``PROMETHEUS_MULTIPROC_DIR``. With
    ``app``, the gauges of its stacked limits too (:class:`LimitsCollector`)."""
    if registry is None and multiprocess_dir():
        registry = CollectorRegistry()
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    registry = registry or REGISTRY
    if app is not None:
        registry.register(LimitsCollector(app))
    return _start_http_server(port, addr=addr, registry=registry)


class MetricsServer(bootsteps.StartStopStep):
    """Worker bootstep: serve ``/metrics`` from the worker's main process while it runs."""

    name = "celery_singleton_lock.metrics"
    port = 9808
    addr = "0.0.0.0"  # noqa: S104 - prometheus_client's own default; set addr to narrow it

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.server: Any = None

    def start(self, worker: Any) -> None:
        pool = str(getattr(worker, "pool_cls", "") or "")
        if "prefork" in pool.lower() and not multiprocess_dir():
            log.error(
                "singleton lock metrics: the prefork pool counts in its pool processes, but "
                "PROMETHEUS_MULTIPROC_DIR is not set, so /metrics shows none of it; set it "
                "to an empty directory in the worker's environment"
            )
        started = serve(self.port, self.addr, app=worker.app)
        self.server = started[0] if isinstance(started, tuple) else started
        log.info("singleton lock metrics on http://%s:%d/metrics", self.addr, self.port)

    def stop(self, worker: Any) -> None:
        if self.server is not None and hasattr(self.server, "shutdown"):
            self.server.shutdown()
            self.server = None


def install(
    app: Any,
    port: int | None = None,
    addr: str = "0.0.0.0",  # noqa: S104 - prometheus_client's own default
    registry: CollectorRegistry | None = None,
) -> LockMetrics:
    """Count lock events in this process (:func:`enable`) and, with ``port``, serve them
    from every ``celery worker`` of ``app`` (a bootstep in its main process)."""
    metrics = enable(registry)
    if port is not None:
        step = type("MetricsServer", (MetricsServer,), {"port": port, "addr": addr})
        app.steps["worker"].add(step)
    return metrics
