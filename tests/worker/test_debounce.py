"""lock_debounce on real workers: a burst of calls runs once, after the quiet time, with the
last call's arguments, and every call gets its result; a steady stream still runs by
lock_debounce_max_wait; stale messages never store a result."""

from __future__ import annotations

import itertools
import time
from types import ModuleType
from typing import Any

import pytest
import redis

from tests.worker.conftest import wait_for

pytestmark = pytest.mark.slow


def _runs(data: redis.Redis, name: str) -> list[tuple[int, float]]:
    found = []
    for entry in data.lrange(f"runs:{name}", 0, -1):
        value, stamp = entry.split()
        found.append((int(value), float(stamp)))
    return found


@pytest.mark.parametrize("task_name", ["debounced", "debounced_queued"])
def test_a_burst_runs_once_with_the_last_arguments(
    proj: ModuleType, data: redis.Redis, workers: Any, task_name: str
) -> None:
    """Five calls 0.1 s apart (quiet time 2 s): one run, at least 2 s after the last
    call, with the last value; all five AsyncResults are one and give that value; the four
    stale messages end without running, each logged as debounced."""
    worker = workers(concurrency=2)
    task = getattr(proj, task_name)
    results = []
    for value in range(1, 6):
        if value > 1:
            time.sleep(0.1)
        last_call = time.time()  # the quiet time starts after this (when Redis sees it)
        results.append(task.delay(f"burst-{task_name}", value))
    assert len({result.id for result in results}) == 1
    assert all(result.get(timeout=30) == 5 for result in results)
    # every stale message is delivered and dropped (bounded), and none of them ran
    assert wait_for(lambda: worker.log().count("not run: debounced") >= 4, timeout=60)
    runs = _runs(data, f"burst-{task_name}")
    assert [value for value, _ in runs] == [5]
    assert worker.log().count("not run: debounced") == 4
    assert runs[0][1] >= last_call + 2.0 - 0.15  # not before the quiet time (clock slack)


@pytest.mark.alone
def test_a_steady_stream_still_runs_by_max_wait(
    proj: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """Calls every 0.1 s for 3.5 s never leave 0.4 s of quiet, yet with max_wait 1 s the
    stream runs about every second, each run with a value from its own burst."""
    workers(concurrency=2)
    started = time.time()
    value = 0
    while time.time() - started < 3.5:
        value += 1
        proj.debounced_capped.delay("stream", value)
        time.sleep(0.1)
    assert wait_for(lambda: len(_runs(data, "stream")) >= 4, timeout=30)
    time.sleep(1.0)
    runs = _runs(data, "stream")
    assert 3 <= len(runs) <= 6
    gaps = [later - earlier for (_, earlier), (_, later) in itertools.pairwise(runs)]
    # about a second apart (max_wait 1 s); 2.5 s leaves a busy machine room and is still
    # below what quiet-time-only debouncing would give (one run after the 3.5 s stream)
    assert all(gap < 2.5 for gap in gaps[:-1])
    values = [run_value for run_value, _ in runs]
    assert values == sorted(values)
    assert values[-1] == value


def test_calls_far_apart_run_separately(proj: ModuleType, data: redis.Redis, workers: Any) -> None:
    """Two calls more than the quiet time apart are two bursts: two runs, two results."""
    workers(concurrency=2)
    first = proj.debounced.delay("apart", 1)
    assert first.get(timeout=30) == 1
    second = proj.debounced.delay("apart", 2)
    assert second.id != first.id
    assert second.get(timeout=30) == 2
    assert [value for value, _ in _runs(data, "apart")] == [1, 2]
