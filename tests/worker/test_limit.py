"""lock_limit=N on real workers: never more than N runs per key at once, slots that come back
after a crash, a delivery that never takes a second slot, and queue-scope duplicates that get
the newest holder's result."""

from __future__ import annotations

import os
import signal
import time
from types import ModuleType
from typing import Any

import pytest
import redis

from celery_singleton_lock.engine.keyspace import companion_key
from tests.worker.conftest import wait_for

pytestmark = pytest.mark.slow


def test_three_slots_never_show_a_fourth_runner(
    proj: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """1,000 runs of one key with lock_limit=3 on two prefork workers (six processes): at
    most three inside at any moment, three side by side at some moment, every run done once,
    every fencing token distinct."""
    workers(concurrency=3)
    workers(concurrency=3)
    results = [proj.limited.delay("k", 0.005, index) for index in range(1000)]
    assert wait_for(lambda: int(data.get("done:k") or 0) == 1000, timeout=240, interval=0.5)
    assert data.get("over:k") is None
    assert data.get("twice:k") is None
    assert max(int(peak) for peak in data.lrange("peaks:k", 0, -1)) == 3
    fences = data.lrange("fences:k", 0, -1)
    assert len(fences) == 1000
    assert len(set(fences)) == 1000
    assert all(result.get(timeout=30) == "ran" for result in results[-5:])


def test_a_killed_runs_slot_comes_back(proj: ModuleType, data: redis.Redis, workers: Any) -> None:
    """Three runs hold the three slots; the pool process of one is SIGKILLed: a fourth run
    gets a slot, usually at once, as the worker's parent frees the slot when it notices the
    loss (which Celery has been seen to take 5 s to notice), else when the dead run's 5 s
    lease ends; the bound (60 s) only fails a slot that never comes back."""
    worker = workers(concurrency=4)
    holders = [proj.limited.delay("crash", 30.0, index) for index in range(3)]
    assert wait_for(lambda: int(data.get("inside:crash") or 0) == 3, timeout=30)
    victim = int(data.lindex("pids:crash", 0) or 0)
    assert victim in worker.children()
    os.kill(victim, signal.SIGKILL)
    data.decr("inside:crash")  # the killed run never leaves its section: count it out
    fourth = proj.limited.delay("crash", 0.0, 99)
    assert fourth.get(timeout=60) == "ran"
    assert data.get("over:crash") is None
    for result in holders:
        result.revoke(terminate=True, signal="SIGKILL")


def test_a_second_delivery_never_takes_a_second_slot(
    proj: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """The same task id delivered twice (published twice by name) while the first runs:
    slots are free, yet the second delivery never runs beside the first."""
    workers(concurrency=3)
    task_id = "same-id-twice"
    for _ in range(2):
        proj.app.send_task("tests.worker.proj.limited", args=("dup", 2.0), task_id=task_id)
    assert wait_for(lambda: int(data.get("done:dup") or 0) >= 1, timeout=60)
    time.sleep(1.0)
    assert data.get("twice:dup") is None
    assert data.get("over:dup") is None


def test_queue_scope_duplicate_gets_the_newest_holder(proj: ModuleType, data: redis.Redis) -> None:
    """With no worker, two calls take both queue-scope slots; a third identical call
    publishes nothing and gets the AsyncResult of the newest holder."""
    first = proj.limited_queued.delay("q")
    second = proj.limited_queued.delay("q")
    third = proj.limited_queued.delay("q")
    assert first.id != second.id
    assert third.id == second.id
    key = proj.limited_queued.lock_key("q")
    assert data.get(key) is not None
    assert data.get(companion_key(key, "slot:2")) is not None
