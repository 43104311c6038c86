"""The metric objects of :mod:`celery_singleton_lock.metrics`: their names, buckets and
label values, the families registered per registry, and the list of every series exposed."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram

from celery_singleton_lock.modes import REPORTED
from celery_singleton_lock.options import SCOPES

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
