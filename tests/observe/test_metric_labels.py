"""Every label of every lock metric comes from a bounded set: the sending task's name, else
``unknown`` (never an object's repr, which carries a memory address and makes a new series
per process), and known scope and policy words. Counted in a real ``prometheus_client``
registry from the package's real signals."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from prometheus_client import CollectorRegistry

from celery_singleton_lock import LockedTask, metrics
from celery_singleton_lock import _observe as observe
from celery_singleton_lock.options import CONFLICT_POLICIES, SCOPES
from celery_singleton_lock.signals import (
    lock_acquired,
    lock_coalesced,
    lock_conflict,
    lock_debounced,
    lock_lost,
    lock_reaped,
    lock_released,
    lock_renewed,
    lock_superseded,
    lock_throttled,
)

PREFIX = "celery_singleton_lock"


@pytest.fixture
def registry() -> CollectorRegistry:
    """A registry of this test's own that the lock metrics count in."""
    own = CollectorRegistry()
    metrics.enable(own)
    return own


@pytest.fixture
def make_app() -> Iterator[Any]:
    """Throwaway apps (in-memory broker: the reap event has somewhere to go)."""
    apps: list[Celery] = []

    def make() -> Celery:
        app = Celery(f"labels{len(apps)}", broker="memory://", set_as_current=False)
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.close()


def samples(registry: CollectorRegistry, metric: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample of ``metric`` (a counter's ``_total``) by its sorted labels."""
    found: dict[tuple[tuple[str, str], ...], float] = {}
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == metric:
                found[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def test_a_reap_sent_by_the_app_is_counted_as_unknown_not_the_apps_repr(
    registry: CollectorRegistry, make_app: Any
) -> None:
    """`celery locks reap` freeing a hold whose task the app does not know sends
    lock_reaped from the app: reaps by two reaper processes' apps land in one series,
    task="unknown", and no label shows an address; a task the app knows counts under its
    name."""
    for _ in range(2):
        app = make_app()

        @app.task(base=LockedTask, shared=False, name="labels.known")
        def known(x: int) -> int:
            return x

        observe.reaped(app, "csl:gone.task:{abc}", "t-1", why="worker gone")
    observe.reaped(app, known.lock_key(1), "t-2", why="worker gone")
    reaped = samples(registry, f"{PREFIX}_reaped_total")
    assert reaped == {(("task", "unknown"),): 2.0, (("task", "labels.known"),): 1.0}


@pytest.mark.parametrize(
    "sender", [None, object(), "a task name?", 42], ids=["none", "object", "str", "int"]
)
def test_every_metric_label_is_bounded_whatever_the_sender(
    registry: CollectorRegistry, make_app: Any, sender: Any
) -> None:
    """Whatever sends a lock signal (an app, no sender, any object) and whatever scope or
    policy it says, every label of every metric is a task name, "unknown", a scope or a
    policy word."""
    app = make_app()

    @app.task(base=LockedTask, shared=False, name="labels.task")
    def task(x: int) -> int:
        return x

    for who in (sender, app, task):
        common = {"key": "csl:x:{1}", "task_id": "t"}
        odd = {"scope": f"scope-{id(who)}", "policy": f"policy-{id(who)}"}
        lock_acquired.send(sender=who, waited=0.1, fencing_token=1, **common, **odd)
        lock_acquired.send(sender=who, waited=0.1, fencing_token=1, scope="queue", **common)
        lock_conflict.send(sender=who, holder_task_id=None, **common, **odd)
        lock_conflict.send(sender=who, holder_task_id=None, policy="debounce", **common)
        lock_released.send(sender=who, held=0.2, fencing_token=1, **common)
        lock_lost.send(sender=who, held=0.2, fencing_token=1, **common)
        lock_renewed.send(sender=who, fencing_token=1, **common)
        lock_throttled.send(sender=who, rate="1/s", retry_in=1.0, **common, **odd)
        lock_coalesced.send(sender=who, scope="queue", **common)
        lock_superseded.send(sender=who, by="u", running=False, **common)
        lock_debounced.send(sender=who, generation=1, **common)
        lock_reaped.send(sender=who, why="gone", **common)

    allowed = {
        "task": {"labels.task", "unknown"},
        "scope": {*SCOPES, "unknown"},
        "policy": {*CONFLICT_POLICIES, "debounce", "unknown"},
        "le": None,  # histogram buckets: fixed by the metric
    }
    seen: dict[str, set[str]] = {}
    for family in registry.collect():
        for sample in family.samples:
            for label, value in sample.labels.items():
                seen.setdefault(label, set()).add(value)
                assert label in allowed, (sample.name, label)
                bounded = allowed[label]
                assert bounded is None or value in bounded, (sample.name, label, value)
    assert seen["task"] == {"labels.task", "unknown"}
    assert {"queue", "unknown"} <= seen["scope"]
    assert {"debounce", "unknown"} <= seen["policy"]
    assert samples(registry, f"{PREFIX}_reaped_total") == {
        (("task", "labels.task"),): 1.0,
        (("task", "unknown"),): 2.0,
    }
