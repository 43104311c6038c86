"""``celery_singleton_lock.metrics`` scraped over HTTP from a real prefork worker whose pool
processes count in ``PROMETHEUS_MULTIPROC_DIR``."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path
from types import ModuleType

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from celery_singleton_lock.engine.stack import stack_base
from celery_singleton_lock.testing import CeleryWorker
from tests.observe.conftest import wait_signal

pytestmark = pytest.mark.slow

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> tuple[str, Samples]:
    """The worker's /metrics text, and every sample by (name, sorted labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return text, samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value, 0 when absent."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_worker_metrics_count_every_pool_process(
    obsproj: ModuleType,
    obs_worker: CeleryWorker,
    metrics_port: int,
    data: redis.Redis,
    name: str,
) -> None:
    """Acquisitions, conflicts by policy, the wait and hold histograms, lost leases and
    renewals from runs in different pool processes add up in the worker's /metrics."""
    _, before = scrape(metrics_port)
    # skip: one runs until the test opens its gate, one is skipped meanwhile (in another
    # pool process, as the first occupies its own). wait: the second waits for the first,
    # which the test lets end 1 s after the second began waiting (its lock_conflict). The
    # order comes from the test's moves, never from how long a body sleeps.
    key = obsproj.job.lock_key(name, 0)
    first = obsproj.job.delay(name, -1)
    wait_signal(data, key, "lock_acquired", timeout=30)
    first_held_from = time.monotonic()  # it acquired before this
    assert obsproj.job.delay(name, 0).get(timeout=30) is None
    wkey = obsproj.waiter.lock_key(name, 0)
    held = obsproj.waiter.delay(name, -1)
    wait_signal(data, wkey, "lock_acquired", timeout=30)
    waited = obsproj.waiter.delay(name, 0)
    wait_signal(data, wkey, "lock_conflict", timeout=30)
    time.sleep(1.0)  # the waiter waits at least this long: the gate is still shut
    data.set(obsproj.gate_key(f"waiter:{name}"), 1, ex=600)
    time.sleep(max(0.0, first_held_from + 1.0 - time.monotonic()))
    data.set(obsproj.gate_key(f"job:{name}"), 1, ex=600)  # held 1 s at least
    # a lease lost by the clock, and a renewed run (0.6 s lease renewed every 0.2 s).
    overrun = obsproj.overrun.delay(name, 1.2)
    renewed = obsproj.renewed.delay(name, 1.2)
    for result in (first, held, waited, overrun, renewed):
        assert result.get(timeout=30) == "ran"
    wait_signal(data, obsproj.renewed.lock_key(name, 0), "lock_released")
    wait_signal(data, obsproj.overrun.lock_key(name, 0), "lock_lost")
    pids = {
        entry["pid"]
        for k in (key, wkey)
        for entry in map(__import__("json").loads, data.lrange(f"signals:{k}", 0, -1))
    }
    assert len(pids) >= 2, "the skipped duplicate ran beside the gated first run"

    text, after = scrape(metrics_port)

    def delta(metric: str, **labels: str) -> float:
        return value(after, metric, **labels) - value(before, metric, **labels)

    prefix = "celery_singleton_lock"
    assert delta(f"{prefix}_acquired_total", task="obs.job", scope="run") == 1
    assert delta(f"{prefix}_acquired_total", task="obs.waiter", scope="run") == 2
    assert delta(f"{prefix}_conflicts_total", task="obs.job", policy="skip") == 1
    assert delta(f"{prefix}_conflicts_total", task="obs.waiter", policy="wait") == 1
    assert delta(f"{prefix}_wait_seconds_count", task="obs.waiter") == 2
    assert delta(f"{prefix}_wait_seconds_bucket", task="obs.waiter", le="0.1") == 1
    # the second waited 1 s and a little: under 5 s unless the machine stalled for seconds
    assert delta(f"{prefix}_wait_seconds_bucket", task="obs.waiter", le="5.0") == 2
    assert delta(f"{prefix}_wait_seconds_sum", task="obs.waiter") >= 1.0
    assert delta(f"{prefix}_held_seconds_count", task="obs.job") == 1
    assert delta(f"{prefix}_held_seconds_sum", task="obs.job") >= 1.0
    assert delta(f"{prefix}_lost_total", task="obs.overrun") == 1
    assert delta(f"{prefix}_lost_total", task="obs.renewed") == 0
    assert delta(f"{prefix}_renewals_total", task="obs.renewed") >= 3
    assert delta(f"{prefix}_renewals_total", task="obs.overrun") == 0
    sample = Path(__file__).resolve().parents[2] / "build" / "metrics-sample.txt"
    sample.parent.mkdir(exist_ok=True)
    sample.write_text(text, encoding="utf-8")


def test_worker_metrics_show_the_stacked_limits(
    obsproj: ModuleType, obs_worker: CeleryWorker, metrics_port: int, data: redis.Redis, name: str
) -> None:
    """While a weight-2 export runs, the worker's /metrics shows its tenant's and the global
    limit's use, holds and number (the tenant's as set in Redis); both go back to 0 after."""
    tenant = f"t{name}"
    capacities = stack_base("obs") + "limits"  # obsproj's singleton_lock_prefix
    data.hset(capacities, f"tenant:{tenant}", 3)
    try:
        running = obsproj.export.delay(name, tenant, 3.0)

        def shown() -> Samples:
            return scrape(metrics_port)[1]

        deadline = time.monotonic() + 20
        samples = shown()
        while value(samples, "celery_singleton_lock_limit_holds", limit=f"tenant:{tenant}") < 1:
            assert time.monotonic() < deadline, "the running export never showed"
            time.sleep(0.2)
            samples = shown()
        assert value(samples, "celery_singleton_lock_limit_in_use", limit=f"tenant:{tenant}") == 2
        assert value(samples, "celery_singleton_lock_limit_number", limit=f"tenant:{tenant}") == 3
        assert value(samples, "celery_singleton_lock_limit_number", limit="global:exports") == 10
        assert value(samples, "celery_singleton_lock_limit_in_use", limit="global:exports") >= 2
        assert running.get(timeout=30) == name
        after = shown()
        assert value(after, "celery_singleton_lock_limit_in_use", limit=f"tenant:{tenant}") == 0
    finally:
        data.delete(capacities)
