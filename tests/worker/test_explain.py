"""``task.lock_explain()``, ``celery locks explain``, ``TaskLocked.explanation`` and the skip
record's explanation, against runs on real prefork workers (issue 25): the holder they
name is the pool process that really runs the body, the waiters and parked calls are the
real calls in the order they came, and the explanation of a conflict crosses the result
backend."""

from __future__ import annotations

import importlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import redis

from celery_singleton_lock import TaskLocked, skip_info
from celery_singleton_lock.explain import Explanation
from celery_singleton_lock.testing import CeleryWorker, RedisServer
from tests.worker.conftest import wait_for

pytestmark = pytest.mark.slow

APP = "tests.worker.explain_proj"
ROOT = Path(__file__).resolve().parents[2]
HOST = socket.gethostname()


@pytest.fixture(scope="module")
def ex(worker_redis: RedisServer) -> ModuleType:
    os.environ["CSL_BROKER_URL"] = worker_redis.url
    os.environ["CSL_BACKEND_URL"] = worker_redis.url.replace("/0", "/1")
    return importlib.import_module(APP)


def _pids(data: redis.Redis, name: str) -> list[int]:
    return [int(pid) for pid in data.lrange(f"pids:{name}", 0, -1)]


def _server_s(client: redis.Redis) -> float:
    """The server's clock, in seconds (the clock explain reports on)."""
    seconds, micros = client.time()  # type: ignore[misc]
    return int(seconds) + int(micros) / 1e6


def _started(data: redis.Redis, name: str, count: int = 1) -> list[int]:
    """The pids of the first ``count`` runs of ``name``, once they started."""
    assert wait_for(lambda: len(_pids(data, name)) >= count, timeout=20), _pids(data, name)
    return _pids(data, name)


def _cli(server: RedisServer, *args: str) -> subprocess.CompletedProcess[str]:
    """``celery -A tests.worker.explain_proj locks ARGS...``."""
    environ = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "CSL_BROKER_URL": server.url,
        "CSL_BACKEND_URL": server.url.replace("/0", "/1"),
    }
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", APP, "locks", *args],
        cwd=ROOT, env=environ, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_the_holder_is_the_pool_process_that_runs_the_body(
    ex: ModuleType,
    data: redis.Redis,
    workers: Callable[..., CeleryWorker],
    worker_redis: RedisServer,
) -> None:
    """A run on a real worker: task id, task, this host and the pid of the pool process that
    runs the body, since when, lease left, the fencing token; the lease's renewal shows once
    the renewer extended it. The CLI prints the same holder, as text and as JSON."""
    workers(concurrency=2, app=APP)
    published = _server_s(data)
    first = ex.hold.delay("h1", 60.0)  # ended below by a push to go:h1
    (pid,) = _started(data, "h1")
    explanation = ex.hold.lock_explain("h1")
    assert explanation.key == ex.hold.lock_key("h1")
    assert (explanation.state, explanation.states) == ("held", ("held",))
    assert (explanation.slots, explanation.slots_held) == (1, 1)
    held = explanation.holder
    assert held is not None
    assert (held.task_id, held.task, held.host, held.pid) == (first.id, "explain.hold", HOST, pid)
    assert held.state == "running"
    assert held.age is not None
    assert held.since is not None
    assert held.since >= published - 0.001  # taken after the publish (server clock)
    assert held.age >= 0
    assert abs(held.since + held.age - explanation.now) < 0.01
    assert held.lease == 9.0
    assert held.lease_left is not None
    assert 0 < held.lease_left <= 9.0
    assert held.fence is not None
    assert held.fence == round(held.since * 1_000_000)
    # the renewer extends a 9 s lease every 3 s: the last renewal becomes known
    assert wait_for(lambda: ex.hold.lock_explain("h1").holder.renewed is not None, timeout=30)
    renewed = ex.hold.lock_explain("h1").holder
    assert renewed.renewed is not None
    # renewed every 3 s; a renewal older than the 9 s lease would mean it was lost
    assert 0 <= renewed.renewed < 9.0
    assert renewed.fence == held.fence

    text = _cli(worker_redis, "explain", "explain.hold", '"h1"')
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].split() == ["Key", explanation.key]
    assert lines[1].split() == ["State", "held"]
    assert lines[2].startswith("Holder")
    assert f"explain.hold[{first.id}] on {HOST}/{pid}: running for " in lines[2]
    assert f"fence {held.fence}" in lines[2]
    shown = _cli(worker_redis, "explain", "explain.hold", '"h1"', "--json")
    assert shown.returncode == 0, shown.stderr
    data_ = json.loads(shown.stdout)
    assert data_["state"] == "held"
    assert data_["holders"][0]["task_id"] == first.id
    assert data_["holders"][0]["pid"] == pid
    data.rpush("go:h1", 1)
    assert first.get(timeout=20) == "h1"
    assert ex.hold.lock_explain("h1").state == "free"


def test_waiters_are_listed_in_turn_order_and_the_wait_log_names_the_holder(
    ex: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker]
) -> None:
    """Two runs wait (``wait``) behind a holder: positions 1 and 2 in the order they came,
    each with its task id, host and pid; the worker logs who each waits for."""
    worker = workers(concurrency=3, app=APP)
    first = ex.hold.delay("w1", 5.0)
    (pid,) = _started(data, "w1")
    second = ex.hold.delay("w1")
    assert wait_for(lambda: ex.hold.lock_explain("w1").waiting == 1, timeout=30)
    third = ex.hold.delay("w1")
    assert wait_for(lambda: ex.hold.lock_explain("w1").waiting == 2, timeout=30)
    explanation = ex.hold.lock_explain("w1")
    assert explanation.holder is not None
    assert explanation.holder.task_id == first.id
    waiters = explanation.waiters
    assert [(w.position, w.task_id) for w in waiters] == [(1, second.id), (2, third.id)]
    assert all(w.task == "explain.hold" and w.host == HOST and w.pid for w in waiters)
    assert len({w.pid for w in waiters} | {pid}) == 3  # three pool processes
    assert waiters[0].waited is not None
    assert waiters[1].waited is not None
    assert waiters[0].waited >= waiters[1].waited
    text = str(explanation)
    assert "Waiters  2 waiting, in turn order" in text
    assert f"1. explain.hold[{second.id}] on {HOST}/{waiters[0].pid}, waiting " in text
    assert f"2. explain.hold[{third.id}] on {HOST}/{waiters[1].pid}, waiting " in text
    key = ex.hold.lock_key("w1")
    logged = f"explain.hold[{second.id}] waiting for lock {key} held by explain.hold[{first.id}]"
    assert wait_for(lambda: f"{logged} on {HOST}/{pid} (" in worker.log(), timeout=30), logged
    assert [r.get(timeout=30) for r in (first, second, third)] == ["w1"] * 3


def test_parked_calls_are_listed_with_their_positions(
    ex: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker]
) -> None:
    """Three runs park behind a holder: the explanation lists them 1, 2, 3 in the order
    they parked, as the park queue will hand them the key."""
    workers(concurrency=2, app=APP)
    first = ex.park.delay("p1", 5.0)
    _started(data, "p1")
    later = []
    for _ in range(3):
        later.append(ex.park.delay("p1"))
        assert wait_for(lambda: later[-1].state == "PARKED", timeout=30)
    explanation = ex.park.lock_explain("p1")
    assert explanation.states == ("held", "parked")
    assert explanation.holder is not None
    assert explanation.holder.task_id == first.id
    assert explanation.parked_total == 3
    assert [(p.position, p.task_id) for p in explanation.parked] == [
        (position, result.id) for position, result in enumerate(later, start=1)
    ]
    assert all(p.task == "explain.park" and p.waited is not None for p in explanation.parked)
    assert f"1. explain.park[{later[0].id}], parked " in str(explanation)
    assert [r.get(timeout=30) for r in (first, *later)] == ["p1"] * 4


def test_throttled_and_held_after_success(
    ex: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker]
) -> None:
    """Two starts of a "2/m" key: throttled, 2 of 2, with the next free start; a success
    under ``lock_release="success"``: held after success by that run, with no process."""
    workers(concurrency=2, app=APP)
    published = _server_s(data)
    assert [ex.paced.delay("t1").get(timeout=20) for _ in range(2)] == ["t1", "t1"]
    explanation = ex.paced.lock_explain("t1")
    assert (explanation.state, explanation.states) == ("throttled", ("throttled",))
    throttle = explanation.throttle
    assert throttle is not None
    assert (throttle.rate, throttle.limit, throttle.window, throttle.count) == ("2/m", 2, 60, 2)
    assert abs(throttle.next_start - (explanation.now + throttle.next_start_in)) < 0.01
    # a minute after the first start, which came after the publish (server clock)
    assert published + 60 - 0.002 <= throttle.next_start <= explanation.now + 60 + 0.002
    assert "Throttle  2 of 2 starts (2/m) in the last 60s; next free start in " in str(explanation)
    skipped = ex.paced.delay("t1")
    assert skipped.get(timeout=20) is None
    skip = skip_info(skipped, app=ex.app)
    assert skip is not None
    assert skip.reason == "throttled"

    done_published = _server_s(data)
    done = ex.once.delay("s1")
    assert done.get(timeout=20) == "s1"
    held_after = ex.once.lock_explain("s1")
    assert (held_after.state, held_after.states) == ("held after success", ("held after success",))
    holder = held_after.holder
    assert holder is not None
    assert (holder.task_id, holder.host, holder.pid) == (done.id, HOST, None)
    assert holder.state == "held after success"
    assert holder.lease == 30.0
    assert holder.lease_left is not None
    # the 30 s hold began after the publish and before this explanation (server clock)
    hold_ends = held_after.now + holder.lease_left
    assert done_published + 30 - 0.002 <= hold_ends <= held_after.now + 30 + 0.002
    assert f"explain.once[{done.id}] on {HOST}: held after success for " in str(held_after)


def test_two_of_three_slots(
    ex: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker]
) -> None:
    """Two runs of a ``lock_limit=3`` key: 2 of 3 slots held, one holder per slot, each the
    pool process that runs it."""
    workers(concurrency=3, app=APP)
    runs = [ex.slots.delay("n1", 5.0) for _ in range(2)]
    pids = _started(data, "n1", 2)
    explanation = ex.slots.lock_explain("n1")
    assert (explanation.state, explanation.slots, explanation.slots_held) == ("held", 3, 2)
    assert {h.task_id for h in explanation.holders} == {r.id for r in runs}
    assert {h.pid for h in explanation.holders} == set(pids)
    assert len({h.slot for h in explanation.holders}) == 2
    assert all(h.state == "running" for h in explanation.holders)
    text = str(explanation)
    assert "Slots   2 of 3 held" in text
    assert text.count("Holder  slot ") == 2
    assert [r.get(timeout=30) for r in runs] == ["n1", "n1"]
    assert ex.slots.lock_explain("n1").slots_held == 0


def test_task_locked_and_the_skip_record_carry_the_explanation(
    ex: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker]
) -> None:
    """A ``raise`` conflict fails with a TaskLocked whose ``.explanation`` (read back from
    the result backend) names the holder; a ``skip`` conflict leaves a skip record whose
    ``explanation`` names it too."""
    workers(concurrency=3, app=APP)
    first = ex.fail.delay("r1", 5.0)
    (pid,) = _started(data, "r1")
    second = ex.fail.delay("r1")
    with pytest.raises(TaskLocked) as raised:
        second.get(timeout=20)
    error = raised.value
    assert (error.key, error.task_id) == (ex.fail.lock_key("r1"), first.id)
    assert isinstance(error.explanation, dict)
    explained = Explanation.from_json(error.explanation)
    assert explained.key == error.key
    assert explained.state == "held"
    assert explained.holder is not None
    assert (explained.holder.task_id, explained.holder.pid) == (first.id, pid)
    assert explained.as_json() == error.explanation

    holder = ex.skip.delay("k1", 5.0)
    (skip_pid,) = _started(data, "k1")
    skipped = ex.skip.delay("k1")
    assert skipped.get(timeout=20) is None
    skip = skip_info(skipped, app=ex.app)
    assert skip is not None
    assert skip.holder_task_id == holder.id
    assert skip.explanation is not None
    recorded = Explanation.from_json(skip.explanation)
    assert recorded.key == ex.skip.lock_key("k1")
    assert recorded.state == "held"
    assert recorded.holder is not None
    assert (recorded.holder.task_id, recorded.holder.pid) == (holder.id, skip_pid)
    assert first.get(timeout=20) == "r1"
    assert holder.get(timeout=20) == "k1"
