"""A call held back by a stacked limit or by its rate under "park" (and a queue-scope call a
limit holds back) waits in the lock Redis, not in a worker (issue 31, finding 1): when the
whole worker that held it back dies, a fresh worker runs it once the limit has room or the
window opens, long before the broker's one-hour visibility timeout could bring anything
back; and it runs once, however many copies of its message are delivered."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
import redis
from celery import signals

from celery_singleton_lock.engine.keyspace import STARTS, companion_key
from celery_singleton_lock.testing import CeleryWorker, RedisServer
from tests.worker.conftest import wait_for

pytestmark = pytest.mark.slow

APP = "tests.worker.held_proj"
QUEUE = "csl-held"
#: Generous bounds (seconds) that matter only when a test fails; each is far below the
#: broker's visibility timeout (an hour), so nothing a bound allows can be a redelivery.
BOUND = 60.0
#: Seconds a call of the rate test waits for its window (server clock): far longer than it
#: takes its worker to acknowledge its message, so the kill comes while it waits.
WINDOW = 30


@pytest.fixture(scope="module")
def hp(worker_redis: RedisServer) -> ModuleType:
    """The project, pointed at the session's server."""
    os.environ["CSL_BROKER_URL"] = worker_redis.url
    os.environ["CSL_BACKEND_URL"] = worker_redis.url.replace("/0", "/1")
    module = importlib.import_module(APP)
    assert module.VISIBILITY_TIMEOUT >= 3600
    return module


def _runs(data: redis.Redis, name: str) -> int:
    return int(data.llen(f"ran:{name}"))


def _hold(hp: ModuleType, data: redis.Redis, weight: int) -> Any:
    """A call of pool p1 of ``weight`` that runs until told to stop (or its worker dies)."""
    holder = hp.pooled.delay("holder", "p1", weight, -1)
    assert wait_for(lambda: _runs(data, "holder") == 1, timeout=BOUND)
    return holder


def _broker_idle(data: redis.Redis, unacked: int) -> bool:
    """No message waits in the queue, and ``unacked`` are delivered but not acknowledged."""
    return int(data.llen(QUEUE)) == 0 and int(data.hlen("unacked")) == unacked


def test_a_call_parked_by_a_limit_outlives_its_worker(
    hp: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker]
) -> None:
    """The filer's case: a weight-3 call runs in a limit of 4, a weight-2 call is parked by
    the limit (PARKED); the whole worker is SIGKILLed and a fresh one started. The holder's
    share ends with its lease, and the parked call runs, once, without the broker having
    redelivered anything (the holder's message is still unacknowledged: it did not run
    again)."""
    first = workers(concurrency=4, app=APP)
    _hold(hp, data, 3)
    parked = hp.pooled.delay("parked", "p1", 2)
    assert wait_for(lambda: parked.state == "PARKED", timeout=BOUND), parked.state
    # the worker keeps nothing of the parked call: only the holder's message is unacked
    kept_nothing = wait_for(lambda: _broker_idle(data, unacked=1), timeout=BOUND)
    first.kill()
    workers(concurrency=4, app=APP)
    assert parked.get(timeout=BOUND) == "ran"
    assert _runs(data, "parked") == 1
    assert kept_nothing
    assert _runs(data, "holder") == 1  # its message was not redelivered
    # ... it still waits for the visibility timeout (the parked call's is acknowledged)
    assert wait_for(lambda: int(data.hlen("unacked")) == 1, timeout=BOUND)


def test_a_call_parked_by_its_rate_outlives_its_worker(
    hp: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker]
) -> None:
    """A start planted in the rate window of a key (1/s) until WINDOW s from now, by the
    server's clock, makes a call of that key wait that long for its window: PARKED, and its
    message acknowledged while it has not run (its worker keeps nothing of it). The whole
    worker is SIGKILLed and a fresh one started: the call runs once its window opens, and
    only then (by the server's clock)."""
    first = workers(concurrency=2, app=APP)
    key = hp.paced.lock_key("r1")
    seconds, micros = data.time()
    planted = seconds * 1000 + micros // 1000 + WINDOW * 1000
    data.zadd(companion_key(key, STARTS), {"planted": planted})
    paced = hp.paced.delay("r1")
    assert wait_for(lambda: paced.state == "PARKED", timeout=BOUND), paced.state
    # A worker that kept its message (an ETA retry) would run it when the window opens.
    assert wait_for(lambda: _broker_idle(data, unacked=0) or _runs(data, "r1"), timeout=BOUND)
    assert _runs(data, "r1") == 0
    first.kill()
    workers(concurrency=2, app=APP)
    assert paced.get(timeout=BOUND + WINDOW) == "ran"
    assert _runs(data, "r1") == 1
    assert int(data.lindex("at:r1", 0) or 0) >= planted + 1000  # not before its window


def test_a_queue_scope_call_held_back_by_a_limit_outlives_its_worker(
    hp: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker]
) -> None:
    """Queue scope (skip): a call accepted at publish and held back by the limit at its run
    keeps its hold (a duplicate call gets its AsyncResult) and comes back from the lock
    Redis, not from its worker's memory: after a SIGKILL of the whole worker, a fresh one
    runs it once when the limit has room."""
    first = workers(concurrency=4, app=APP)
    _hold(hp, data, 3)
    call = hp.pooled_queued.delay("queued", "p1", 2)
    assert wait_for(lambda: call.state == "RETRY", timeout=BOUND), call.state
    assert wait_for(lambda: _broker_idle(data, unacked=1), timeout=BOUND)
    assert hp.pooled_queued.delay("queued", "p1", 2).id == call.id  # still deduplicated
    first.kill()
    workers(concurrency=4, app=APP)
    assert call.get(timeout=BOUND) == "ran"
    assert _runs(data, "queued") == 1


def test_a_parked_call_delivered_twice_runs_once(
    hp: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker]
) -> None:
    """A call parked by the limit has its message delivered a second time (the same task id
    and headers, as a redelivery has) while it is parked, and a third time after it ran:
    it runs once, its result is the one run's, and the copies end without running."""
    workers(concurrency=4, app=APP)
    _hold(hp, data, 3)
    captured: list[tuple[Any, ...]] = []

    def grab(body: Any = None, headers: Any = None, **more: Any) -> None:
        captured.append((body, dict(headers or {}), dict(more.get("properties") or {})))

    signals.before_task_publish.connect(grab, weak=False)
    try:
        parked = hp.pooled.delay("twice", "p1", 2)
    finally:
        signals.before_task_publish.disconnect(grab)
    assert wait_for(lambda: parked.state == "PARKED", timeout=BOUND), parked.state
    _publish_copy(hp, captured)
    assert wait_for(lambda: _broker_idle(data, unacked=1), timeout=BOUND)
    assert parked.state == "PARKED"
    data.set("stop:holder", 1)
    assert parked.get(timeout=BOUND) == "ran"
    _publish_copy(hp, captured)
    assert wait_for(lambda: _broker_idle(data, unacked=0), timeout=BOUND)
    assert _runs(data, "twice") == 1
    assert parked.state == "SUCCESS"
    assert parked.get(timeout=30) == "ran"


def _publish_copy(hp: ModuleType, captured: list[tuple[Any, ...]]) -> None:
    """Publish the captured message again, as it was (same task id, same headers)."""
    with hp.app.producer_or_acquire() as producer:
        for body, headers, properties in captured:
            kept = {k: v for k, v in properties.items() if k in ("correlation_id", "reply_to")}
            producer.publish(body, routing_key=QUEUE, headers=headers, serializer="json",
                             **kept)  # fmt: skip
