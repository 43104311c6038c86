"""Conflict policies, argument binding, queue-scope dedup and self.retry() on real workers."""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any

import pytest
import redis

from celery_singleton_lock import TaskLocked
from tests.worker.conftest import wait_for

pytestmark = pytest.mark.slow


def _runs(data: redis.Redis, name: str) -> list[tuple[float, float]]:
    """(start, end) pairs recorded by ``section`` for ``name``."""
    starts, ends = [], []
    for event in data.lrange(f"events:{name}", 0, -1):
        kind, stamp = event.split()[:2]
        (starts if kind == "start" else ends).append(float(stamp))
    return list(zip(starts, ends, strict=False))


def _settled(results: list[Any], timeout: float = 60) -> None:
    assert wait_for(lambda: all(r.ready() for r in results), timeout=timeout)


def test_skip_runs_one_and_skips_duplicates(
    proj: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """Default policy: of four simultaneous calls with equal arguments one body runs, the
    others end successfully without running; a call after it finished runs again."""
    workers(concurrency=4)
    results = [proj.skippy.delay("s1", 1.5) for _ in range(4)]
    _settled(results)
    assert sorted(str(r.result) for r in results) == ["None", "None", "None", "ran"]
    assert all(r.successful() for r in results)
    assert proj.skippy.delay("s1", 0.1).get(timeout=30) == "ran"
    assert len(_runs(data, "s1")) == 2
    assert data.get("overlaps:s1") is None


def test_binding_makes_equivalent_calls_one_lock(
    proj: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """bound(1), bound(1, 2), bound(a=1, b=2) and bound(1, note="x") are the same work
    (lock_keys a, b after defaults): only one of them runs at a time; bound(1, 3) is other work."""
    workers(concurrency=5)
    same = [
        proj.bound.delay(1),
        proj.bound.delay(1, 2),
        proj.bound.delay(a=1, b=2),
        proj.bound.delay(1, note="x"),
    ]
    other = proj.bound.delay(1, 3)
    _settled([*same, other])
    assert sum(r.result is not None for r in same) == 1
    assert other.result == ""
    assert data.get("overlaps:bound-1-2") is None


def test_queue_scope_publishes_one_message_for_duplicates(
    proj: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """Five delay() calls while one is queued give one run and one shared task id; after
    that run ends, a new call runs again."""
    results = [proj.queued.delay("q1", 0.5) for _ in range(5)]
    assert len({r.id for r in results}) == 1
    workers(concurrency=2)
    assert results[0].get(timeout=30) == "ran"
    assert len(_runs(data, "q1")) == 1
    again = proj.queued.delay("q1", 0.1)
    assert again.id != results[0].id
    assert again.get(timeout=30) == "ran"
    assert len(_runs(data, "q1")) == 2


def test_raise_policy_fails_the_duplicate_with_task_locked(
    proj: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """Under "raise" the duplicate fails with TaskLocked naming the key and the holder's id."""
    workers(concurrency=2)
    first = proj.raising.delay("r1", 2.0)
    assert wait_for(lambda: data.llen("events:r1") >= 1, timeout=20)
    second = proj.raising.delay("r1", 2.0)
    with pytest.raises(TaskLocked) as caught:
        second.get(timeout=20)
    assert caught.value.task_id == first.id
    assert caught.value.key.startswith("csl:tests.worker.proj.raising:{")
    assert first.get(timeout=20) == "ran"


def test_retry_policy_runs_the_duplicate_after_the_first(
    proj: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """Under "retry" the duplicate frees its worker slot, comes back, and runs after the
    first run ended — never alongside it."""
    workers(concurrency=2)
    first = proj.retrying.delay("t1", 1.5)
    assert wait_for(lambda: data.llen("events:t1") >= 1, timeout=20)
    second = proj.retrying.delay("t1", 1.5)
    assert first.get(timeout=30) == "ran"
    assert second.get(timeout=30) == "ran"
    runs = _runs(data, "t1")
    assert len(runs) == 2
    assert runs[1][0] >= runs[0][1]


def test_self_retry_in_queue_scope_keeps_the_lock(
    proj: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """A queue-scope task that calls self.retry() keeps its lock while the retry waits:
    a duplicate meanwhile publishes nothing and gets the same id; the retry owns the lock."""
    workers(concurrency=2)
    first = proj.retry_queue.delay("rq")
    assert wait_for(lambda: data.get("attempts:rq") == "1", timeout=20)
    time.sleep(0.3)
    duplicate = proj.retry_queue.delay("rq")
    assert duplicate.id == first.id
    assert first.get(timeout=30) == "attempt 2"
    assert data.lrange("locked-during:rq", 0, -1) == ["1", "1"]
    assert int(data.get("attempts:rq")) == 2


def test_self_retry_in_run_scope_releases_between_attempts(
    proj: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """A run-scope task that calls self.retry() frees its lock when the attempt ends, so
    other work with the same key can run before the retry."""
    workers(concurrency=2)
    first = proj.retry_run.delay("rr")
    assert wait_for(lambda: data.get("attempts:rr") == "1", timeout=20)
    time.sleep(0.3)
    # The lock is free during the countdown: another call with the same key runs at once.
    other = proj.retry_run.delay("rr")
    assert other.get(timeout=30) == "attempt 2"
    assert first.get(timeout=30) == "attempt 3"


def test_queue_timeout_bounds_how_long_a_queued_message_holds_the_lock(
    proj: ModuleType, data: redis.Redis
) -> None:
    """lock_queue_timeout is the lease of a queued message: within it duplicates share the
    id; once it ran out (no worker took the message), the next call publishes anew."""
    first = proj.queued_short.delay("qs")
    assert proj.queued_short.delay("qs").id == first.id
    keys = list(data.scan_iter(match="csl:tests.worker.proj.queued_short:*"))
    assert len(keys) == 1
    assert 0 < data.pttl(keys[0]) <= 1000 + 1100  # lease 1 s + grace
    time.sleep(1.2)
    assert proj.queued_short.delay("qs").id != first.id
