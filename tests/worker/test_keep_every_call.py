"""Issue 21: the modes tried as a user would — busy workers, countdowns, killed processes —
and every call still ends in a state someone can see (real prefork workers, private Redis).

Each test failed on the modes before the fix it names."""

from __future__ import annotations

import importlib
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
import redis

from celery_singleton_lock import skip_info
from celery_singleton_lock.testing import CeleryWorker, RedisServer
from tests.worker.conftest import admitted_at, wait_for

pytestmark = pytest.mark.slow

APP = "tests.worker.keep_proj"


@pytest.fixture(scope="module")
def keep(worker_redis: RedisServer) -> ModuleType:
    os.environ["CSL_BROKER_URL"] = worker_redis.url
    os.environ["CSL_BACKEND_URL"] = worker_redis.url.replace("/0", "/1")
    return importlib.import_module(APP)


def _runs(data: redis.Redis, name: str) -> list[tuple[int, float]]:
    """(value, start time) of every run of ``name``, in order."""
    found = []
    for entry in data.lrange(f"runs:{name}", 0, -1):
        value, started, _ = str(entry).split()
        found.append((int(value), float(started)))
    return found


def _values(data: redis.Redis, name: str) -> list[int]:
    return [value for value, _ in _runs(data, name)]


def _start(workers: Callable[..., CeleryWorker], concurrency: int = 2) -> CeleryWorker:
    return workers(concurrency=concurrency, app=APP)


def test_a_superseded_call_never_runs_even_when_it_comes_late(
    keep: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker]
) -> None:
    """21.1: a queued call with a countdown is superseded; the new call runs and frees the
    key before the old message comes. The old one must not run then (it would run last,
    with stale arguments, while its AsyncResult says REVOKED)."""
    worker = _start(workers)
    old = keep.replaced.apply_async(("late", 1), countdown=3)
    new = keep.replaced.delay("late", 2)
    assert new.get(timeout=30) == 2
    assert old.state == "REVOKED"
    assert wait_for(lambda: f"{old.id}] not run: superseded by {new.id}" in worker.log(), 20)
    assert _values(data, "late") == [2]
    assert old.state == "REVOKED"


def test_a_superseded_call_ends_revoked_though_its_retry_state_came_after(
    keep: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker]
) -> None:
    """A call that retries (its retry message published, then Celery's tracer stores RETRY)
    is superseded between those two steps: the tracer's RETRY lands over the REVOKED the
    supersede stored. When the retry's message comes it does not run, and its state ends
    REVOKED again, not RETRY for ever (the invariant checker caught it under load)."""
    old = keep.replaced.apply_async(("race", 1), countdown=4)
    new = keep.replaced.delay("race", 2)
    assert old.state == "REVOKED"
    keep.app.backend.store_result(old.id, None, "RETRY")  # the tracer's late store

    def state() -> str:
        return str(keep.app.AsyncResult(old.id).state)  # a fresh one: no cached state

    assert state() == "RETRY"
    worker = _start(workers)
    assert new.get(timeout=30) == 2
    assert wait_for(lambda: f"{old.id}] not run: superseded by {new.id}" in worker.log(), 30)
    assert wait_for(lambda: state() == "REVOKED", 10), state()
    assert _values(data, "race") == [2]


def test_calls_around_the_end_of_a_run_are_never_left_behind(
    keep: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker]
) -> None:
    """21.2: coalesce calls land all around the ends of short runs; each gets an
    AsyncResult that finishes (none left PENDING as a follow-up nobody publishes)."""
    _start(workers)
    results: list[Any] = []
    guard = threading.Lock()

    def call(offset: int) -> None:
        for value in range(offset, offset + 60):
            result = keep.coalesced.delay("edge", value, 0.005)
            with guard:
                results.append(result)
            time.sleep(0.002 * (value % 5))

    threads = [threading.Thread(target=call, args=(n * 100,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(results) == 240
    assert wait_for(lambda: all(result.ready() for result in results), timeout=90), [
        result.id for result in results if not result.ready()
    ]
    assert data.get("over:edge") is None


def test_a_burst_delayed_by_a_busy_worker_still_runs(
    keep: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker]
) -> None:
    """21.3: the worker is busy past a burst's due time and a later call opens the next
    burst; the first burst still runs, with its last call's value, and so does the next."""
    _start(workers, concurrency=1)
    keep.busy.delay(2.5)
    time.sleep(0.3)
    first = [keep.burst.delay("b3", value) for value in range(1, 6)]
    time.sleep(0.8)  # the first burst is due while the worker is still busy
    later = keep.burst.delay("b3", 6)
    assert len({result.id for result in first}) == 1
    assert later.id != first[0].id
    assert first[0].get(timeout=30) == 5
    assert later.get(timeout=30) == 6
    assert sorted(_values(data, "b3")) == [5, 6]


@pytest.mark.parametrize("task", ["burst", "burst_retry"])
def test_a_burst_that_finds_its_key_busy_runs_later(
    keep: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker], task: str
) -> None:
    """21.4: a burst's run finds its key held by the previous burst's run; under skip it
    is the work of its calls (not a duplicate) and under retry its retry is not dropped as
    stale: it runs after the holder, with its value."""
    job = getattr(keep, task)
    _start(workers)
    first = job.delay(f"b4-{task}", 1, 2.0)  # runs 0.3 s from now, holding the key 2 s
    time.sleep(1.0)
    second = job.delay(f"b4-{task}", 2)
    assert first.get(timeout=30) == 1
    assert second.get(timeout=30) == 2
    assert _values(data, f"b4-{task}") == [1, 2]
    assert data.get(f"over:b4-{task}") is None


def test_a_killed_burst_run_is_redelivered_and_runs(
    keep: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker]
) -> None:
    """21.5: acks_late + reject_on_worker_lost: the pool process running a burst is killed;
    the redelivered message runs (it used to be dropped as stale)."""
    _start(workers, concurrency=1)
    result = keep.burst_killed.delay("b5", 7)
    pid = wait_for(lambda: data.lindex("pids:b5", 0), timeout=30)
    assert pid
    os.kill(int(pid), signal.SIGKILL)
    assert result.get(timeout=60) == 7
    assert _values(data, "b5") == [7]


@pytest.mark.parametrize("pool", ["solo", "threads"])
def test_replace_running_is_refused_where_the_pool_cannot_stop_a_run(
    workers: Callable[..., CeleryWorker], pool: str
) -> None:
    """21.6: lock_replace_running on a pool that cannot terminate a running task would let
    the replaced run go on beside the new one: the worker refuses to start, naming it."""
    with pytest.raises(RuntimeError, match="lock_replace_running needs a pool"):
        workers(concurrency=1, pool=pool, extra_env={"CSL_WORKER_POOL": "prefork"})


def test_a_throttled_follow_up_runs_when_its_window_frees(
    keep: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker]
) -> None:
    """21.7: coalesce with lock_rate_limit: the follow-up handed the key right after its
    holder started is throttled; it is the work, so it runs when the window frees (it used
    to fail with TaskThrottled)."""
    _start(workers)
    first = keep.follow_throttled.delay("t7", 1, 0.2)
    assert wait_for(lambda: _values(data, "t7") == [1], timeout=30)
    second = keep.follow_throttled.delay("t7", 2)
    assert first.get(timeout=30) == 1
    assert second.get(timeout=30) == 2
    first_at, second_at = admitted_at(data, "t7")
    assert second_at - first_at >= 1000  # one start a second, on the server's clock


def test_every_slot_is_held_after_a_success(
    keep: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker]
) -> None:
    """21.9: lock_limit=2 with lock_release="success": both runs keep their slot lock_hold
    seconds (slot 2 used to be released and its run reported as having lost its lease)."""
    worker = _start(workers)
    runs = [keep.held_slots.delay("s9", value, 0.5) for value in (1, 2)]
    assert sorted(result.get(timeout=30) for result in runs) == [1, 2]
    third = keep.held_slots.delay("s9", 3)
    assert third.get(timeout=20) is None
    assert skip_info(third) is not None
    assert "was lost while the task ran" not in worker.log()
    assert "had expired before the run ended" not in worker.log()


def test_a_debounced_tasks_own_retry_keeps_its_countdown(
    keep: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker]
) -> None:
    """21.11: self.retry(countdown=2) in a debounced task comes back after 2 s (it used to
    come back after lock_debounce, joining a burst)."""
    _start(workers, concurrency=1)
    result = keep.burst_retrying.delay("r11", 5)
    assert result.get(timeout=30) == 5
    attempts = [float(at) for at in data.lrange("attempts:r11", 0, -1)]
    assert len(attempts) == 2
    assert attempts[1] - attempts[0] >= 1.8


def test_the_rate_sets_the_pace_of_busy_retries(
    keep: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker]
) -> None:
    """21.12: 20 calls of one key at "4/s" under retry: a run that finds the key busy comes
    back at its turn in the rate, never after a backoff of seconds."""
    worker = _start(workers, concurrency=3)
    results = [keep.paced.delay("p12", index) for index in range(20)]
    assert sorted(result.get(timeout=60) for result in results) == list(range(20))
    countdowns = [float(found) for found in re.findall(r"Retry in ([0-9.]+)s", worker.log())]
    assert countdowns, "no run met a busy or throttled key"
    assert max(countdowns) <= 1.3, countdowns
    starts = admitted_at(data, "p12")
    assert len(starts) == 20  # every run admitted once
    for index in range(4, len(starts)):
        assert starts[index] - starts[index - 4] >= 1000  # never 5 in a second (server ms)
