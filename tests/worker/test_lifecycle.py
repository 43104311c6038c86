"""Crashes, time limits, renewal, revocation and config-locked tasks on real workers."""

from __future__ import annotations

import os
import signal
import time
from types import ModuleType
from typing import Any

import pytest
import redis

from celery_singleton_lock.engine.value import parse_value
from tests.worker.conftest import wait_for
from tests.worker.test_policies import _runs

pytestmark = pytest.mark.slow


def _lock_keys(data: redis.Redis, task: str) -> list[str]:
    return [k for k in data.scan_iter(match=f"csl:tests.worker.proj.{task}:*") if "signal" not in k]


def _server_ms(data: redis.Redis) -> int:
    seconds, micros = data.time()  # type: ignore[misc]
    return int(seconds) * 1000 + int(micros) // 1000


def _freed_before_its_lease_ended(data: redis.Redis, key: str, published: int) -> None:
    """``key``, taken under a 30 s lease by a run published at server time ``published``,
    is gone while that lease still had time left on the server's clock (it ends 30 s after
    the take, which came after the publish): it was released by the worker's parent, not
    left to run out. No bound of its own on how long that took."""
    assert wait_for(lambda: data.get(key) is None, timeout=60)
    assert _server_ms(data) < published + 30_000, "it ran out: nobody freed it"


def test_sigkilled_worker_lock_frees_within_its_lease(
    proj: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """SIGKILL the whole worker (parent and children) mid-task with a 2 s lease: another
    worker runs the same key once the lease ends, never before the kill nor before the
    lease's end. The dead key is kept for a minute, so only the lease's end (on the server's
    clock) can let the successor in, not Redis expiring the key."""
    doomed = workers(concurrency=1)
    proj.crashy.delay("c1", 60.0)
    assert wait_for(lambda: data.llen("events:c1") >= 1, timeout=20)
    workers(concurrency=1)
    time.sleep(1.0)  # let the renewer extend at least once: the lease is still 2 s
    doomed.kill()
    killed = time.time()
    key = proj.crashy.lock_key("c1")
    assert data.pexpire(key, 60_000)  # the value's lease, not the key's TTL, must end it
    dead = parse_value(data.get(key)).expiry_ms
    assert dead is not None
    successor = proj.crashy.delay("c1", 0.1)
    assert successor.get(timeout=60) == "ran"
    second_start = _runs(data, "c1")[0][0] if len(_runs(data, "c1")) else None
    starts = [float(e.split()[1]) for e in data.lrange("events:c1", 0, -1) if e.startswith("start")]
    assert len(starts) == 2, second_start
    assert starts[1] > killed
    assert starts[1] * 1000 >= dead - 5  # one host clock; 5 ms for rounding


def test_hard_time_limit_child_lock_is_freed_by_the_parent(
    proj: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """A child killed by the hard time limit (1.5 s) cannot release its 30 s lease; the
    worker's parent sees the loss and frees the lock right away."""
    workers(concurrency=1)
    published = _server_ms(data)
    proj.hard_limit.delay("h1")
    assert wait_for(lambda: data.llen("events:h1") >= 1, timeout=20)
    _freed_before_its_lease_ended(data, proj.hard_limit.lock_key("h1"), published)


def test_sigkilled_child_lock_is_freed_by_the_parent(
    proj: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """SIGKILL only the pool child running a task (as the OOM killer would): the parent
    reports the worker lost and releases the 30 s lock within seconds."""
    worker = workers(concurrency=1)
    published = _server_ms(data)
    proj.hard_limit.delay("k1")
    assert wait_for(lambda: data.llen("events:k1") >= 1, timeout=20)
    children = worker.children()
    assert children
    for pid in children:
        os.kill(pid, signal.SIGKILL)
    _freed_before_its_lease_ended(data, proj.hard_limit.lock_key("k1"), published)


def test_renewal_keeps_a_long_run_exclusive(
    proj: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """A 6 s body with a 1 s lease keeps its lock: a duplicate sent once the first lease
    has ended on the server's clock (so only renewal can be keeping the key) is skipped.
    The duplicate is sent about 1 s in, leaving the first run 5 s to be still running."""
    workers(concurrency=2)
    first = proj.renewing.delay("n1", 6.0)
    assert wait_for(lambda: data.llen("events:n1") >= 1, timeout=20)
    key = proj.renewing.lock_key("n1", 6.0)
    taken = data.get(key)
    assert taken is not None
    first_lease_ends = parse_value(taken).expiry_ms
    assert first_lease_ends is not None
    assert wait_for(lambda: _server_ms(data) > first_lease_ends, timeout=30)
    duplicate = proj.renewing.delay("n1", 6.0)
    assert duplicate.get(timeout=20) is None
    assert first.get(timeout=20) == "ran"
    assert data.get("overlaps:n1") is None
    assert len(_runs(data, "n1")) == 1


def test_revoking_a_queued_queue_scope_task_frees_its_lock(
    proj: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """A queue-scope task revoked while still queued never runs and its lock is released,
    so the next call publishes (a new id) and runs."""
    workers(concurrency=1)
    busy = proj.skippy.delay("busy", 2.0)
    assert wait_for(lambda: data.llen("events:busy") >= 1, timeout=20)
    queued = proj.queued.delay("rv", 0.1)
    assert _lock_keys(data, "queued")
    queued.revoke()
    assert wait_for(lambda: not _lock_keys(data, "queued"), timeout=15)
    busy.get(timeout=20)
    again = proj.queued.delay("rv", 0.1)
    assert again.id != queued.id
    assert again.get(timeout=20) == "ran"
    assert len(_runs(data, "rv")) == 1


def test_config_locks_a_task_without_locked_task_base(
    proj: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """singleton_lock_tasks locks a plain @app.task: duplicates are skipped, no overlap."""
    workers(concurrency=3)
    results = [proj.plain_job.delay("p1", 1.5) for _ in range(3)]
    assert wait_for(lambda: all(r.ready() for r in results), timeout=30)
    assert sorted(str(r.result) for r in results) == ["None", "None", "ran"]
    assert data.get("overlaps:plain-p1") is None


@pytest.mark.parametrize("pool", ["threads", "solo"])
def test_other_pools_serialise_purchases(
    proj: ModuleType, data: redis.Redis, workers: Any, pool: str
) -> None:
    """The threads and solo pools give the same guarantee as prefork: never oversold."""
    workers(concurrency=4 if pool == "threads" else 1, pool=pool)
    workers(concurrency=4 if pool == "threads" else 1, pool=pool)
    data.set("stock:sku-p", 10)
    results = [proj.buy.delay("sku-p", user) for user in range(40)]
    assert wait_for(lambda: all(r.ready() for r in results), timeout=90)
    assert sum(bool(r.result) for r in results) == 10
    assert int(data.get("stock:sku-p")) == 0
    assert data.get("overlaps:sku-p") is None


def test_warm_shutdown_releases_as_the_task_ends(
    proj: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """SIGTERM (warm shutdown) lets the running task finish, and its lock is released
    when it ends, before the worker exits — not left to expire."""
    worker = workers(concurrency=1)
    result = proj.skippy.delay("warm", 2.0)
    assert wait_for(lambda: data.llen("events:warm") >= 1, timeout=20)
    assert _lock_keys(data, "skippy")
    os.kill(worker.pid, signal.SIGTERM)
    worker.process.wait(timeout=30)
    assert result.get(timeout=30) == "ran"
    assert not _lock_keys(data, "skippy")


def test_redelivery_after_a_killed_child_runs_instead_of_skipping(
    proj: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """With acks_late and reject_on_worker_lost, the message of a SIGKILLed child is
    delivered again; the redelivery takes over its dead predecessor's 30 s lock and runs
    (it must not end as a 'skipped' success that silently drops the work)."""
    worker = workers(concurrency=1)
    result = proj.redelivered.delay("rd")
    assert wait_for(lambda: data.llen("events:rd") >= 1, timeout=20)
    for pid in worker.children():
        os.kill(pid, signal.SIGKILL)
    assert result.get(timeout=20) == "ran"
    assert int(data.get("deliveries:rd")) == 2


def test_terminated_child_that_keeps_running_keeps_its_lock(
    proj: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """revoke(terminate=True) of a body that outlives SIGTERM: the parent frees the lock
    only once that child has stopped running it, so a duplicate meanwhile is skipped; after
    the body ends the lock is free again."""
    workers(concurrency=2)
    first = proj.stubborn.delay("stub", 4.0)
    assert wait_for(lambda: data.llen("events:stub") >= 1, timeout=20)
    proj.app.control.revoke(first.id, terminate=True)
    assert wait_for(lambda: data.llen("sigterm:stub") >= 1, timeout=30)
    time.sleep(0.5)  # the parent has had its chance to release early
    duplicate = proj.stubborn.delay("stub", 0.2)
    duplicate.get(timeout=20)
    assert data.get("overlaps:stub") is None
    assert wait_for(lambda: data.llen("events:stub") >= 2, timeout=20)  # the body ended
    after = proj.stubborn.delay("stub", 0.1)
    assert after.get(timeout=20) == "ran"
    assert data.get("overlaps:stub") is None


@pytest.mark.parametrize("task", ["skippy", "queued"])
def test_a_run_has_released_its_key_when_its_result_is_stored(
    proj: ModuleType, data: redis.Redis, workers: Any, task: str
) -> None:
    """The key is free by the time Celery stores the result (checked from task_success,
    which Celery sends after storing it), so a caller that sees the result and calls again
    runs again: ten calls in a row, each after the last one's get(), all run."""
    workers(concurrency=2)
    locked = getattr(proj, task)
    name = f"seq-{task}"
    ids = []
    for _ in range(10):
        result = locked.delay(name, 0.01)
        assert result.get(timeout=20) == "ran"
        ids.append(result.id)
    assert len(set(ids)) == 10
    assert wait_for(lambda: data.llen(f"held-at-success:{name}") == 10, timeout=30)
    assert data.lrange(f"held-at-success:{name}", 0, -1) == ["0"] * 10
    assert sum(1 for e in data.lrange(f"events:{name}", 0, -1) if e.startswith("start")) == 10
