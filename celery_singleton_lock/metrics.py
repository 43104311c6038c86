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

import dataclasses
import logging
import math
import os
import threading
from dataclasses import dataclass
from typing import Any

from celery import Task, bootsteps

from celery_singleton_lock._observe import (
    beat_deposed,
    beat_elected,
    beat_slot_caught_up,
    beat_slot_sent,
    beat_slot_skipped,
    beat_slots_missed,
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
    lock_unparked,
)
from celery_singleton_lock.client import redis_for
from celery_singleton_lock.config import settings_for
from celery_singleton_lock.modes import REPORTED
from celery_singleton_lock.ops.limits import LimitRow, code_limits, read_limits
from celery_singleton_lock.options import SCOPES

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
    from prometheus_client import start_http_server as _start_http_server
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.multiprocess import MultiProcessCollector
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "celery_singleton_lock.metrics needs prometheus_client: "
        "pip install 'celery-singleton-lock[metrics]'"
    ) from exc

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

log = logging.getLogger("celery_singleton_lock.metrics")

PREFIX = "celery_singleton_lock"
#: Seconds: acquisitions are milliseconds unless they wait (``lock_wait`` is 60 s by default).
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0)
#: Seconds: from short critical sections to hour-long jobs.
HELD_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
#: The label value of anything outside a label's bounded set (a sender that is not a task).
UNKNOWN = "unknown"
#: The ``scope`` label's values.
SCOPE_LABELS = frozenset(SCOPES)
#: The ``policy`` label's values: what the signals report, the conflict policies' and a
#: debounced call's (``modes.REPORTED``).
POLICY_LABELS = frozenset(REPORTED)
#: The most ``limit`` series each limit gauge shows (the fullest limits first).
LIMIT_SERIES = 100
#: The limit gauges: (name, help).
LIMIT_GAUGES = (
    ("limit_in_use", "Weight of the live shares of a stacked limit (lock_limits)."),
    ("limit_holds", "Runs holding a share of a stacked limit (lock_limits)."),
    ("limit_number", "The number of a stacked limit that applies now (set in Redis, else code)."),
)


class LimitsCollector(Collector):
    """The limit gauges of ``app``, read from its lock Redis when scraped (one ``HGETALL``,
    a ``SCAN`` of the app's limit keys and one pipelined read; see ``celery locks limit
    list``, which shows the same). A Redis error is logged and the gauges are left out of
    that scrape."""

    def __init__(self, app: Any, most: int = LIMIT_SERIES) -> None:
        self.app = app
        self.most = most

    def describe(self) -> list[Any]:
        return [GaugeMetricFamily(f"{PREFIX}_{name}", text) for name, text in LIMIT_GAUGES]

    def collect(self) -> list[Any]:
        try:
            rows = limit_rows(self.app)
        except Exception as exc:  # noqa: BLE001 - a scrape never fails for the locks
            log.warning("singleton lock metrics: could not read the stacked limits: %s", exc)
            return []
        families = [
            GaugeMetricFamily(f"{PREFIX}_{name}", text, labels=["limit"])
            for name, text in LIMIT_GAUGES
        ]
        live = [row for row in rows if row.in_use is not None]
        live.sort(key=lambda row: (-(row.in_use or 0), row.name))
        for row in live[: self.most]:
            number = min(row.applies, default=None)
            values = (row.in_use, row.holds, number)
            for family, value in zip(families, values, strict=True):
                if value is not None and value != math.inf:
                    family.add_metric([row.name], float(value))
        return families


@dataclass(frozen=True)
class LockMetrics:
    """The metric objects, registered once per registry."""

    acquired: Counter
    conflicts: Counter
    wait: Histogram
    held: Histogram
    lost: Counter
    renewals: Counter
    throttled: Counter
    coalesced: Counter
    superseded: Counter
    debounced: Counter
    reaped: Counter
    parked: Counter
    unparked: Counter
    beat_elected: Counter
    beat_deposed: Counter
    beat_slots: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> LockMetrics:
        """Register every metric in ``registry``."""
        return cls(
            acquired=Counter(
                f"{PREFIX}_acquired",
                "Task runs that took their singleton lock.",
                ["task", "scope"],
                registry=registry,
            ),
            conflicts=Counter(
                f"{PREFIX}_conflicts",
                "Task runs (or queue-scope publishes) that found their "
                "lock held, by the policy applied.",
                ["task", "policy"],
                registry=registry,
            ),
            wait=Histogram(
                f"{PREFIX}_wait_seconds",
                "Seconds from a run's first try to holding its lock.",
                ["task"],
                buckets=WAIT_BUCKETS,
                registry=registry,
            ),
            held=Histogram(
                f"{PREFIX}_held_seconds",
                "Seconds a run held its lock, counted at release.",
                ["task"],
                buckets=HELD_BUCKETS,
                registry=registry,
            ),
            lost=Counter(
                f"{PREFIX}_lost",
                "Leases lost while the task body ran.",
                ["task"],
                registry=registry,
            ),
            renewals=Counter(
                f"{PREFIX}_renewals",
                "Lease extensions while a run held its lock.",
                ["task"],
                registry=registry,
            ),
            throttled=Counter(
                f"{PREFIX}_throttled",
                "Task runs that did not start because their key used "
                "up its lock_rate_limit, by the policy applied.",
                ["task", "policy"],
                registry=registry,
            ),
            coalesced=Counter(
                f"{PREFIX}_coalesced",
                "Calls that became (or updated) a pending follow-up instead of being published.",
                ["task"],
                registry=registry,
            ),
            superseded=Counter(
                f"{PREFIX}_superseded",
                "Queued calls superseded by a newer one (replace).",
                ["task"],
                registry=registry,
            ),
            debounced=Counter(
                f"{PREFIX}_debounced",
                "Debounced messages that ended without running: a "
                "later call of their burst runs instead.",
                ["task"],
                registry=registry,
            ),
            reaped=Counter(
                f"{PREFIX}_reaped",
                "Holds freed by `celery locks reap` (holder proven gone).",
                ["task"],
                registry=registry,
            ),
            parked=Counter(
                f"{PREFIX}_parked",
                "Calls parked in their key's queue (lock_on_conflict='park') instead of "
                "waiting in a worker or retrying.",
                ["task"],
                registry=registry,
            ),
            unparked=Counter(
                f"{PREFIX}_unparked",
                "Parked calls that were handed their key and started.",
                ["task"],
                registry=registry,
            ),
            beat_elected=Counter(
                f"{PREFIX}_beat_elected",
                "Beat replicas (LeaderScheduler) that became the leader of their group.",
                registry=registry,
            ),
            beat_deposed=Counter(
                f"{PREFIX}_beat_deposed",
                "Beat leaders that stopped leading (lease taken, lost, or the replica stopped).",
                registry=registry,
            ),
            beat_slots=Counter(
                f"{PREFIX}_beat_slots",
                "Slots of beat entries by outcome: sent, caught_up (a missed slot sent by the "
                "catch-up rule), skipped (taken already), missed (not sent by the catch-up rule).",
                ["outcome"],
                registry=registry,
            ),
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
            (lock_acquired, _on_acquired),
            (lock_conflict, _on_conflict),
            (lock_released, _on_released),
            (lock_lost, _on_lost),
            (lock_renewed, _on_renewed),
            (lock_throttled, _on_throttled),
            (lock_coalesced, _counting("coalesced")),
            (lock_superseded, _on_superseded),
            (lock_debounced, _counting("debounced")),
            (lock_reaped, _counting("reaped")),
            (lock_parked, _counting("parked")),
            (lock_unparked, _counting("unparked")),
            (beat_elected, _on_beat_elected),
            (beat_deposed, _on_beat_deposed),
            (beat_slot_sent, _beat_slots("sent")),
            (beat_slot_caught_up, _beat_slots("caught_up")),
            (beat_slot_skipped, _beat_slots("skipped")),
            (beat_slots_missed, _beat_slots("missed")),
        ):
            uid = f"csl.metrics.{getattr(signal, 'name', id(signal))}"
            signal.connect(receiver, weak=False, dispatch_uid=uid)
    return found


def limit_rows(app: Any) -> list[LimitRow]:
    """The stacked limits of ``app`` as ``celery locks limit list`` reads them."""
    settings = settings_for(app)
    client = redis_for(app, settings.url)
    return read_limits(client, settings.prefix, code_limits(app))


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


@dataclass(frozen=True)
class Series:
    """One series name Prometheus scrapes from a worker: its ``family`` (as registered),
    the family's ``type``, its ``labels`` (in registration order) and help ``text``. A
    counter ``x`` is scraped as ``x_total``; a histogram ``x`` as ``x_bucket`` (label
    ``le`` added), ``x_sum`` and ``x_count``."""

    name: str
    family: str
    type: str
    labels: tuple[str, ...]
    text: str


def exposed() -> list[Series]:
    """Every series the package exposes: the families :meth:`LockMetrics.create`
    registers and the limit gauges :class:`LimitsCollector` reads at each scrape. The
    reference table of the docs, the dashboard test and the docs' name check read it."""
    metrics = LockMetrics.create(CollectorRegistry())
    found: list[Series] = []
    for row in dataclasses.fields(metrics):
        metric = getattr(metrics, row.name)
        (family,) = metric.describe()
        labels = tuple(metric._labelnames)
        text = family.documentation

        def series(name: str, extra: tuple[str, ...] = ()) -> Series:
            return Series(name, family.name, family.type, labels + extra, text)  # noqa: B023

        if family.type == "counter":
            found.append(series(f"{family.name}_total"))
        elif family.type == "histogram":
            found.append(series(f"{family.name}_bucket", ("le",)))
            found += [series(f"{family.name}_sum"), series(f"{family.name}_count")]
        else:
            found.append(series(family.name))
    for name, text in LIMIT_GAUGES:
        family_name = f"{PREFIX}_{name}"
        found.append(Series(family_name, family_name, "gauge", ("limit",), text))
    return found


def reference_markdown() -> str:
    """The reference table of the metrics for the docs, generated from :func:`exposed`
    (each family's exposed name, type, labels and help text)."""
    lines = ["| metric | type | labels | what |", "|---|---|---|---|"]
    seen: set[str] = set()
    for series in exposed():
        if series.family in seen:
            continue
        seen.add(series.family)
        name = series.name if series.type == "counter" else series.family
        labels = ", ".join(f"`{label}`" for label in series.labels if label != "le")
        what = series.text.replace("|", "\\|")
        if series.type == "gauge":
            what += " Read at each scrape."
        lines.append(f"| `{name}` | {series.type} | {labels} | {what} |")
    return "\n".join(lines) + "\n"
