"""The lock signals, sent from a real prefork worker (and from a producer for queue-scope
publishes), with their keyword arguments; a broken receiver never breaks a task; sending
them asks Redis for nothing."""

from __future__ import annotations

import os
import uuid
from types import ModuleType
from typing import Any

import pytest
import redis
from celery import Celery

from celery_singleton_lock import LockedTask, TaskLocked, clear_locks, signals
from celery_singleton_lock.testing import CeleryWorker, RedisServer
from tests.observe.conftest import recorded, wait_signal
from tests.worker.conftest import wait_for

pytestmark = pytest.mark.slow


def test_acquired_then_released_from_the_worker(
    obsproj: ModuleType, obs_worker: CeleryWorker, data: redis.Redis, name: str
) -> None:
    """A run sends lock_acquired (fencing token, waited, policy, scope) and then
    lock_released (same token, held seconds, final state) from its pool process."""
    result = obsproj.job.delay(name, 0.3)
    assert result.get(timeout=30) == "ran"
    key = obsproj.job.lock_key(name, 0.3)
    released = wait_signal(data, key, "lock_released")
    acquired = wait_signal(data, key, "lock_acquired")
    assert [entry["signal"] for entry in recorded(data, key)] == ["lock_acquired", "lock_released"]
    assert acquired["sender"] == released["sender"] == "obs.job"
    assert acquired["task_id"] == released["task_id"] == result.id
    assert isinstance(acquired["fencing_token"], int)
    assert acquired["fencing_token"] > 0
    assert released["fencing_token"] == acquired["fencing_token"]
    assert 0 <= acquired["waited"] < 2
    assert (acquired["policy"], acquired["scope"]) == ("skip", "run")
    assert 0.3 <= released["held"] < 5
    assert released["state"] == "SUCCESS"
    assert released["renewals"] == 0
    assert acquired["pid"] != os.getpid()
    assert acquired["pid"] in obs_worker.children()


def test_wait_sends_conflict_then_acquired_with_the_time_waited(
    obsproj: ModuleType, obs_worker: CeleryWorker, data: redis.Redis, name: str
) -> None:
    """Under "wait" a duplicate sends lock_conflict(policy="wait") as it starts waiting,
    then lock_acquired whose ``waited`` covers the holder's remaining run."""
    key = obsproj.waiter.lock_key(name, 0)
    first = obsproj.waiter.delay(name, 1.5)
    wait_signal(data, key, "lock_acquired")
    second = obsproj.waiter.delay(name, 0)
    assert second.get(timeout=30) == "ran"
    assert first.get(timeout=30) == "ran"
    conflict = wait_signal(data, key, "lock_conflict")
    assert (conflict["task_id"], conflict["policy"]) == (second.id, "wait")
    assert conflict["holder_task_id"] == first.id
    got = [e for e in recorded(data, key) if e["signal"] == "lock_acquired"]
    assert [e["task_id"] for e in got] == [first.id, second.id]
    assert 0.5 < got[1]["waited"] < 10
    assert got[1]["fencing_token"] > got[0]["fencing_token"]


def test_raise_sends_conflict_and_the_duplicate_fails(
    obsproj: ModuleType, obs_worker: CeleryWorker, data: redis.Redis, name: str
) -> None:
    """Under "raise" the duplicate sends lock_conflict(policy="raise") naming the holder,
    and fails with TaskLocked."""
    key = obsproj.raiser.lock_key(name, 0)
    first = obsproj.raiser.delay(name, 1.5)
    wait_signal(data, key, "lock_acquired")
    second = obsproj.raiser.delay(name, 0)
    with pytest.raises(TaskLocked):
        second.get(timeout=30)
    conflict = wait_signal(data, key, "lock_conflict")
    assert (conflict["task_id"], conflict["policy"]) == (second.id, "raise")
    assert conflict["holder_task_id"] == first.id
    assert first.get(timeout=30) == "ran"


def test_lease_lost_by_the_clock(
    obsproj: ModuleType, obs_worker: CeleryWorker, data: redis.Redis, name: str
) -> None:
    """A body that outlives its unrenewed 0.6 s lease sends lock_lost once, with the
    hold's fencing token and the seconds it held."""
    key = obsproj.overrun.lock_key(name, 0)
    assert obsproj.overrun.delay(name, 1.5).get(timeout=30) == "ran"
    lost = wait_signal(data, key, "lock_lost")
    acquired = wait_signal(data, key, "lock_acquired")
    assert lost["fencing_token"] == acquired["fencing_token"]
    assert lost["held"] >= 1.4
    wait_for(lambda: len(recorded(data, key)) >= 3, timeout=30)
    assert [e["signal"] for e in recorded(data, key)].count("lock_lost") == 1


def test_lease_lost_found_by_renewal(
    obsproj: ModuleType, obs_worker: CeleryWorker, data: redis.Redis, name: str
) -> None:
    """A renewed run sends lock_renewed for each extension; when its key vanishes the
    renewal finds the hold gone and the run ends with lock_lost (no lock_released)."""
    key = obsproj.renewed.lock_key(name, 0)
    result = obsproj.renewed.delay(name, 2.5)
    assert wait_for(
        lambda: sum(e["signal"] == "lock_renewed" for e in recorded(data, key)) >= 2, timeout=15
    )
    assert clear_locks(obsproj.app, "obs.renewed:*") >= 1
    assert result.get(timeout=30) == "ran"
    lost = wait_signal(data, key, "lock_lost")
    signals_sent = [e["signal"] for e in recorded(data, key)]
    assert "lock_released" not in signals_sent
    renewed = signals_sent.count("lock_renewed")
    assert renewed >= 2
    assert lost["renewals"] == renewed


def test_queue_scope_duplicate_publish_sends_conflict_in_the_producer(
    obsproj: ModuleType, obs_worker: CeleryWorker, data: redis.Redis, name: str
) -> None:
    """A queue-scope .delay() that finds its key held publishes nothing and sends
    lock_conflict(policy="skip", task_id=None) from the producer's own process."""
    key = obsproj.queued.lock_key(name, 0)
    first = obsproj.queued.delay(name, 1.0)
    again = obsproj.queued.delay(name, 0)
    assert again.id == first.id
    conflict = wait_signal(data, key, "lock_conflict")
    assert conflict["pid"] == os.getpid()
    assert (conflict["task_id"], conflict["policy"], conflict["scope"]) == (None, "skip", "queue")
    assert conflict["holder_task_id"] == first.id
    assert first.get(timeout=30) == "ran"


def test_a_broken_receiver_never_breaks_a_task(
    obsproj: ModuleType, obs_worker: CeleryWorker, name: str
) -> None:
    """The project's lock_acquired receiver that always raises is logged by the worker,
    and the task still runs and succeeds."""
    assert obsproj.job.delay(name, 0).get(timeout=30) == "ran"
    assert wait_for(lambda: "a broken lock_acquired receiver" in obs_worker.log(), timeout=30)


def _commands(client: redis.Redis) -> int:
    """Commands the server has run so far (INFO commandstats), not counting INFO itself."""
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


def test_signals_cost_no_redis_command(fresh_server: RedisServer) -> None:
    """An eager locked run sends the same Redis commands whether or not receivers listen to
    every lock signal: the signals are computed from what the lock already knows."""
    app = Celery(f"quiet-{uuid.uuid4().hex[:6]}", broker="memory://", set_as_current=False)
    app.conf.update(task_always_eager=True, singleton_lock_url=fresh_server.url)

    @app.task(base=LockedTask, lock_keys=["n"], lock_timeout=5)
    def step(n: int) -> int:
        return n

    client = redis.Redis.from_url(fresh_server.url)
    heard: list[str] = []

    def listen(signal: Any = None, **_: Any) -> None:
        heard.append(signal.name)

    step.delay(0).get()  # scripts loaded, connections made
    before = _commands(client)
    step.delay(1).get()
    quiet = _commands(client) - before
    all_signals = (signals.lock_acquired, signals.lock_released, signals.lock_conflict,
                   signals.lock_lost, signals.lock_renewed)  # fmt: skip
    for signal in all_signals:
        signal.connect(listen, weak=False, dispatch_uid="test.listen")
    try:
        before = _commands(client)
        step.delay(2).get()
        listened = _commands(client) - before
    finally:
        for signal in all_signals:
            signal.disconnect(listen, dispatch_uid="test.listen")
    client.close()
    assert heard == ["lock_acquired", "lock_released"]
    assert listened == quiet
