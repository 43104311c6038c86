"""coalesce and replace on real workers: duplicates collapse into one pending follow-up
with the latest arguments, published once when the holder ends (also when it was lost); a
replaced queued call never runs and is stored as REVOKED; a running holder is followed, or
revoked on request."""

from __future__ import annotations

import os
import signal
import threading
import time
from types import ModuleType
from typing import Any

import pytest
import redis

from celery_singleton_lock.signals import lock_coalesced, lock_superseded
from celery_singleton_lock.testing import FaultProxy, RedisServer
from tests.worker.conftest import wait_for

pytestmark = pytest.mark.slow


def _values(data: redis.Redis, name: str) -> list[int]:
    return [int(value) for value in data.lrange(f"values:{name}", 0, -1)]


def test_hundred_concurrent_calls_publish_one_follow_up(
    proj: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """While a coalesced run goes on, 100 calls from 20 threads all get the AsyncResult of
    one follow-up, which runs exactly once after the holder, with one of their values; each
    call sends lock_coalesced naming that follow-up."""
    told: list[str] = []

    def on_coalesced(sender: Any = None, task_id: str = "", **_: Any) -> None:
        told.append(task_id)

    lock_coalesced.connect(on_coalesced, weak=False, dispatch_uid="test.coalesced")
    workers(concurrency=2)
    first = proj.coalesced.delay("c100", -1, 0)  # runs until the gate opens, below
    assert wait_for(lambda: _values(data, "c100") == [0], timeout=30)
    ids: list[str] = []
    guard = threading.Lock()

    def call(start: int) -> None:
        for value in range(start, start + 5):
            result = proj.coalesced.delay("c100", 0.0, value)
            with guard:
                ids.append(result.id)

    threads = [threading.Thread(target=call, args=(1 + 5 * n,)) for n in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(ids) == 100
    assert len(set(ids)) == 1
    follow_up = proj.coalesced.AsyncResult(ids[0])
    data.set("gate:c100", 1, ex=600)  # all 100 calls were made while the first ran
    assert first.get(timeout=30) == 0
    value = follow_up.get(timeout=30)
    time.sleep(0.5)
    assert _values(data, "c100") == [0, value]
    assert 1 <= value <= 100
    assert data.get("over:c100") is None
    lock_coalesced.disconnect(dispatch_uid="test.coalesced")
    assert told == [ids[0]] * 100


def test_the_latest_arguments_win(proj: ModuleType, data: redis.Redis, workers: Any) -> None:
    """Calls 1, 2, 3 made one after another during a run collapse into one follow-up that
    runs with 3; a call after everything finished runs on its own."""
    workers(concurrency=2)
    proj.coalesced.delay("latest", 1.5, 0)
    assert wait_for(lambda: _values(data, "latest") == [0], timeout=30)
    results = [proj.coalesced.delay("latest", 0.0, value) for value in (1, 2, 3)]
    assert len({result.id for result in results}) == 1
    assert results[0].get(timeout=30) == 3
    assert proj.coalesced.delay("latest", 0.0, 4).get(timeout=30) == 4
    assert _values(data, "latest") == [0, 3, 4]


def test_a_lost_holder_still_hands_over(proj: ModuleType, data: redis.Redis, workers: Any) -> None:
    """The holder's pool process is SIGKILLed while a follow-up waits: the worker's parent
    hands the key to the follow-up, which runs."""
    worker = workers(concurrency=2)
    proj.coalesced.delay("lost", 30.0, 0)
    assert wait_for(lambda: _values(data, "lost") == [0], timeout=30)
    follow_up = proj.coalesced.delay("lost", 0.0, 1)
    victim = int(data.lindex("pids:lost", 0) or 0)
    assert victim in worker.children()
    os.kill(victim, signal.SIGKILL)
    assert follow_up.get(timeout=30) == 1
    assert _values(data, "lost") == [0, 1]


def test_a_hand_over_stalled_past_its_timeout_still_publishes_the_follow_up(
    proj: ModuleType, data: redis.Redis, workers: Any, worker_redis: RedisServer
) -> None:
    """The lock Redis stops answering as the holder's run ends: its hand-over times out,
    and the script, held up on the wire, runs later with nobody to hear its reply (the
    follow-up was handed the key and its call removed). The run tries again and gets the
    call it handed: the follow-up is published and runs once, after the holder."""
    with FaultProxy(worker_redis.port) as proxy:
        url = proxy.url + "?socket_timeout=1&socket_connect_timeout=1"
        worker = workers(concurrency=1, extra_env={"CSL_LOCK_URL": url})
        first = proj.coalesced.delay("stalled", 1.0, 0)
        assert wait_for(lambda: _values(data, "stalled") == [0], timeout=30)
        follow_up = proj.coalesced.delay("stalled", 0.0, 5)  # past the proxy: not stalled
        assert follow_up.id != first.id
        proxy.stall()
        try:  # the body ends (1 s); its hand-over times out (1 s)
            assert wait_for(lambda: "could not hand" in worker.log(), timeout=20)
            time.sleep(1.5)
        finally:
            proxy.resume()
        assert first.get(timeout=30) == 0
        assert follow_up.get(timeout=60) == 5
        time.sleep(0.5)
        assert _values(data, "stalled") == [0, 5]
        assert data.get("over:stalled") is None


def test_a_follow_up_left_behind_is_handed_the_key_by_the_sweep(
    proj: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """A holder whose message was lost before it ran (purged here) and whose hold then
    vanished leaves its follow-up beside a free key with nobody to publish it: a worker's
    sweep hands the follow-up the key and publishes it, and it runs."""
    proj.app.control.purge()
    proj.coalesced.delay("orphan", 0.0, 1)  # no worker yet: it holds the key, queued
    follow_up = proj.coalesced.delay("orphan", 0.0, 2)
    keys = [key for key in data.scan_iter("*coalesced*") if key.endswith("}")]
    assert len(keys) == 1
    assert proj.app.control.purge() == 1  # the holder's message is lost
    data.delete(keys[0])  # and its hold ran out
    workers(concurrency=1)
    assert follow_up.get(timeout=30) == 2
    assert _values(data, "orphan") == [2]


def test_replace_supersedes_a_queued_call(
    proj: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """With no worker yet, a second call replaces the queued first one (lock_superseded
    names both): the first is stored as REVOKED (ready) and, once a worker runs, never runs
    (its log says by whom); the second runs."""
    told: list[tuple[str, str]] = []

    def on_superseded(sender: Any = None, task_id: str = "", by: str = "", **_: Any) -> None:
        told.append((task_id, by))

    lock_superseded.connect(on_superseded, weak=False, dispatch_uid="test.superseded")
    old = proj.replaced.delay("rq", 0.0, 1)
    new = proj.replaced.delay("rq", 0.0, 2)
    lock_superseded.disconnect(dispatch_uid="test.superseded")
    assert told == [(old.id, new.id)]
    assert new.id != old.id
    assert old.ready()
    assert old.state == "REVOKED"
    worker = workers(concurrency=2)
    assert new.get(timeout=30) == 2
    assert wait_for(lambda: f"not run: superseded by {new.id}" in worker.log(), timeout=30)
    assert _values(data, "rq") == [2]
    assert old.state == "REVOKED"


def test_replace_follows_a_running_call(proj: ModuleType, data: redis.Redis, workers: Any) -> None:
    """A replacing call made while the holder runs is never dropped: it runs right after."""
    workers(concurrency=2)
    first = proj.replaced.delay("rr", 1.5, 1)
    assert wait_for(lambda: _values(data, "rr") == [1], timeout=30)
    second = proj.replaced.delay("rr", 0.0, 2)
    assert second.get(timeout=30) == 2
    assert first.get(timeout=30) == 1
    assert _values(data, "rr") == [1, 2]
    assert data.get("over:rr") is None


def test_replace_running_revokes_the_holder(
    proj: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """With lock_replace_running the running holder is revoked (terminated) and the new
    call runs at once, with a larger fencing token."""
    workers(concurrency=2)
    first = proj.replaced_running.delay("rv", 30.0, 1)
    assert wait_for(lambda: _values(data, "rv") == [1], timeout=30)
    second = proj.replaced_running.delay("rv", 0.0, 2)
    assert second.get(timeout=30) == 2
    assert wait_for(lambda: first.state == "REVOKED", timeout=30)
    fences = [int(fence) for fence in data.lrange("fences:rv", 0, -1)]
    assert fences == sorted(fences)
    assert len(set(fences)) == 2
