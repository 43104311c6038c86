"""lock_on_conflict="park" on real prefork workers (issue 23): a run whose key is held parks
instead of blocking a pool process or retrying; the key goes to the parked calls in the
order they came; every parked call runs once, also when the process releasing the key, or
a whole worker, is killed."""

from __future__ import annotations

import importlib
import os
import signal
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
import redis
from celery import signals

from celery_singleton_lock.signals import lock_parked
from celery_singleton_lock.testing import CeleryWorker, RedisServer
from tests.worker.conftest import admitted_at, wait_for

pytestmark = pytest.mark.slow

APP = "tests.worker.keep_proj"


@pytest.fixture(scope="module")
def keep(worker_redis: RedisServer) -> ModuleType:
    os.environ["CSL_BROKER_URL"] = worker_redis.url
    os.environ["CSL_BACKEND_URL"] = worker_redis.url.replace("/0", "/1")
    return importlib.import_module(APP)


def _runs(data: redis.Redis, name: str) -> list[tuple[int, float, int]]:
    found = []
    for entry in data.lrange(f"runs:{name}", 0, -1):
        value, started, pid = str(entry).split()
        found.append((int(value), float(started), int(pid)))
    return found


def test_parked_runs_take_turns_in_arrival_order_without_retries(
    keep: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker]
) -> None:
    """Five calls of a busy key park (state PARKED) and then run one at a time, in the order
    they came, without a single retry and without holding a pool process while parked."""
    worker = workers(concurrency=3, app=APP)
    first = keep.parked_job.delay("p1", 0, 4.0)
    assert wait_for(lambda: data.llen("runs:p1") == 1, timeout=20)
    later = []
    for value in range(1, 6):
        # One at a time: two free pool processes could otherwise park two close calls in
        # either order (arrival order is the order they reach the park queue).
        call = keep.parked_job.delay("p1", value, 0.05)
        later.append(call)
        assert wait_for(lambda call=call: call.state == "PARKED", timeout=30), call.state
    assert later[2].info == {"key": keep.parked_job.lock_key("p1", 0), "position": 3}
    assert first.get(timeout=20) == 0
    assert [result.get(timeout=20) for result in later] == [1, 2, 3, 4, 5]
    assert [value for value, _, _ in _runs(data, "p1")] == [0, 1, 2, 3, 4, 5]
    assert data.get("over:p1") is None
    assert "Retry in" not in worker.log()


def test_a_parked_call_does_not_hold_a_pool_process(
    keep: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker]
) -> None:
    """One pool process: while a hot key is held, its parked calls leave the process free
    for other keys' calls, which finish before the hot key's holder does."""
    workers(concurrency=2, app=APP)
    keep.parked_job.delay("hot", 0, 2.0)
    assert wait_for(lambda: data.llen("runs:hot") == 1, timeout=20)
    hot = [keep.parked_job.delay("hot", value) for value in range(1, 5)]
    others = [keep.parked_job.delay(f"cold-{value}", value) for value in range(6)]
    assert [result.get(timeout=30) for result in others] == list(range(6))
    assert not any(result.ready() for result in hot)
    assert [result.get(timeout=20) for result in hot] == [1, 2, 3, 4]


def test_queue_scope_parks_at_publish(
    keep: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker]
) -> None:
    """In queue scope a .delay() whose key is held parks at publish: no message is in the
    broker until its turn; each parked call then runs once, in order."""
    told: list[int] = []
    lock_parked.connect(lambda sender=None, position=0, **_: told.append(position),
                        weak=False, dispatch_uid="test.parked")  # fmt: skip
    try:
        first = keep.parked_queued.delay("q1", 0, 1.0)  # no worker yet: it stays queued
        later = [keep.parked_queued.delay("q1", value) for value in (1, 2, 3)]
        assert data.llen("csl-keep") == 1  # only the first call's message exists
        assert [result.state for result in later] == ["PARKED"] * 3
        assert told == [1, 2, 3]
        workers(concurrency=2, app=APP)
        assert first.get(timeout=20) == 0
        assert [result.get(timeout=20) for result in later] == [1, 2, 3]
        assert [value for value, _, _ in _runs(data, "q1")] == [0, 1, 2, 3]
    finally:
        lock_parked.disconnect(dispatch_uid="test.parked")


def test_two_slots_run_two_and_park_the_rest(
    keep: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker]
) -> None:
    """lock_limit=2: two run at once, the others park and run as slots free, never more
    than two at once."""
    workers(concurrency=4, app=APP)
    results = [keep.parked_pair.delay("pair", value, 0.4) for value in range(8)]
    assert sorted(result.get(timeout=40) for result in results) == list(range(8))
    runs = _runs(data, "pair")
    assert len(runs) == 8
    assert max(int(seen) for seen in data.lrange("inside-seen:pair", 0, -1)) == 2
    starts = sorted(started for _, started, _ in runs)
    for index in range(2, len(starts)):
        assert starts[index] - starts[index - 2] >= 0.35  # a third start waits for a slot


def test_a_killed_holder_hands_the_key_to_the_parked(
    keep: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker]
) -> None:
    """The pool process holding the key is SIGKILLed: the worker's parent frees the key and
    hands it to the first parked call, which runs; so do the others."""
    workers(concurrency=3, app=APP)
    keep.parked_job.delay("k1", 0, 30.0)
    assert wait_for(lambda: data.llen("runs:k1") == 1, timeout=20)
    later = [keep.parked_job.delay("k1", value) for value in (1, 2, 3)]
    assert wait_for(lambda: all(r.state == "PARKED" for r in later), timeout=30)
    os.kill(_runs(data, "k1")[0][2], signal.SIGKILL)
    assert [result.get(timeout=30) for result in later] == [1, 2, 3]


def test_a_killed_worker_leaves_nothing_parked_for_ever(
    keep: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker]
) -> None:
    """The whole worker holding the key is SIGKILLed (no parent to free it): when the
    lease ends, another worker's sweep hands the key to the parked calls."""
    holder = workers(concurrency=1, app=APP)
    keep.parked_late.delay("k2", 0, 30.0)
    assert wait_for(lambda: data.llen("runs:k2") == 1, timeout=20)
    later = [keep.parked_late.delay("k2", value) for value in (1, 2)]
    workers(concurrency=2, app=APP)
    assert wait_for(lambda: all(r.state == "PARKED" for r in later), timeout=30)
    os.killpg(holder.pid, signal.SIGKILL)
    assert [result.get(timeout=40) for result in later] == [1, 2]


def test_a_throttled_run_parks_until_its_window_frees(
    keep: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker]
) -> None:
    """lock_rate_limit="2/s" under park: runs over the rate are published again for the
    moment their window frees, without a retry counted, and never more than 2 a second."""
    workers(concurrency=3, app=APP)
    results = [keep.parked_paced.delay("paced", value) for value in range(6)]
    assert sorted(result.get(timeout=30) for result in results) == list(range(6))
    starts = admitted_at(data, "paced")
    assert len(starts) == 6  # every run admitted once
    for index in range(2, len(starts)):
        assert starts[index] - starts[index - 2] >= 1000  # never 3 in a second (server ms)


def _order(data: redis.Redis, name: str) -> list[int]:
    return [value for value, _, _ in _runs(data, name)]


def test_enqueue_order_runs_calls_in_the_order_they_were_made(
    keep: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker]
) -> None:
    """lock_order="enqueue": the first call's message waits in a queue no worker reads yet;
    the four calls made after it are delivered first and park (their turn has not come)
    instead of running ahead of it. Once a worker reads that queue, all five run in the
    order they were made."""
    workers(concurrency=3, app=APP)
    first = keep.ordered_job.apply_async(("o1", 0, 0.1), queue="csl-late")
    later = [keep.ordered_job.delay("o1", value, 0.05) for value in range(1, 5)]
    assert wait_for(lambda: all(r.state == "PARKED" for r in later), timeout=30), [
        r.state for r in later
    ]
    time.sleep(0.5)
    assert _order(data, "o1") == []  # nothing ran ahead of the first call
    workers(concurrency=1, app=APP, queues=("csl-late",))
    assert first.get(timeout=20) == 0
    assert [result.get(timeout=20) for result in later] == [1, 2, 3, 4]
    assert _order(data, "o1") == [0, 1, 2, 3, 4]
    assert data.get("over:o1") is None


def test_a_higher_priority_goes_first_in_order_within_a_priority(
    keep: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker]
) -> None:
    """On a Redis broker a lower number is a higher priority: behind a running call, two
    calls of priority 5 and then one of priority 1 were made; the priority 1 call runs
    next, then the two others in the order they were made."""
    workers(concurrency=3, app=APP)
    keep.ordered_job.delay("o2", 0, 1.0)
    assert wait_for(lambda: data.llen("runs:o2") == 1, timeout=20)
    low = [keep.ordered_job.apply_async(("o2", value), priority=5) for value in (1, 2)]
    high = keep.ordered_job.apply_async(("o2", 3), priority=1)
    assert [result.get(timeout=20) for result in (*low, high)] == [1, 2, 3]
    assert _order(data, "o2") == [0, 3, 1, 2]


def test_a_call_with_a_countdown_steps_aside(
    keep: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker]
) -> None:
    """A call made with a countdown takes its turn when its time comes: the calls made
    after it do not wait for it."""
    workers(concurrency=3, app=APP)
    keep.ordered_job.delay("o3", 0, 0.3)
    assert wait_for(lambda: data.llen("runs:o3") == 1, timeout=20)
    delayed = keep.ordered_job.apply_async(("o3", 1), countdown=3)
    after = [keep.ordered_job.delay("o3", value) for value in (2, 3)]
    assert [result.get(timeout=30) for result in after] == [2, 3]
    assert not delayed.ready()
    assert delayed.get(timeout=20) == 1
    assert _order(data, "o3") == [0, 2, 3, 1]


@pytest.mark.parametrize("kill", ["pool process", "worker"])
def test_ordered_calls_survive_a_killed_holder(
    keep: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker], kill: str
) -> None:
    """The pool process running the first call is SIGKILLed (its worker's parent frees the
    key), or its whole worker is (the lease runs out, a sweep hands the key on): the calls
    behind it still run, once each, in the order they were made."""
    holder = workers(concurrency=1, app=APP, queues=("csl-late",))
    keep.ordered_job.apply_async(("o4", 0, 30.0), queue="csl-late")
    assert wait_for(lambda: data.llen("runs:o4") == 1, timeout=20)
    later = [keep.ordered_job.delay("o4", value, 0.05) for value in (1, 2, 3, 4)]
    workers(concurrency=2, app=APP)
    assert wait_for(lambda: all(r.state == "PARKED" for r in later), timeout=30)
    data.decr("inside:o4")  # the run about to be killed never leaves on its own
    if kill == "worker":
        os.killpg(holder.pid, signal.SIGKILL)
    else:
        os.kill(_runs(data, "o4")[0][2], signal.SIGKILL)
    assert [result.get(timeout=40) for result in later] == [1, 2, 3, 4]
    assert _order(data, "o4") == [0, 1, 2, 3, 4]
    assert data.get("over:o4") is None


@pytest.mark.parametrize("events", [True, False], ids=["-E", "no-events"])
def test_parked_and_unparked_events_follow_the_worker_s_task_events(
    keep: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker], events: bool
) -> None:
    """A worker started with -E sends task-lock-parked and task-lock-unparked for a parked
    call; one without sends none (as Celery's own task events), while the call still
    parks and runs."""
    from tests.observe.test_skip import EventCapture  # noqa: PLC0415 - a test helper

    workers(concurrency=2, app=APP, extra_args=("-E",) if events else ())
    name = f"ev-{events}"
    with EventCapture(keep.app, "task-lock-unparked") as capture:
        keep.parked_job.delay(name, 0, 1.0)
        assert wait_for(lambda: data.llen(f"runs:{name}") == 1, timeout=20)
        later = keep.parked_job.delay(name, 1)
        assert wait_for(lambda: later.state == "PARKED", timeout=30)
        assert later.get(timeout=20) == 1
        got = capture.done.wait(5)
    assert got is events
    if events:
        assert capture.events[0]["uuid"] == later.id


def _copy_takes_the_grant(
    keep: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker], name: str,
    seconds: float,
) -> Any:  # fmt: skip
    """A call (``seconds`` long) published twice parks; its key is handed to it while no
    worker reads its queue, and its second copy, delivered first from another queue, takes
    the grant and runs. Returns the call's result; the handed copy waits in the default
    queue for a worker."""
    workers(concurrency=2, app=APP, queues=("csl-late",))
    parker = workers(concurrency=1, app=APP)  # ready before the holder starts
    # The holder runs long enough for the call to park and its worker to stop.
    keep.ordered_job.apply_async((name, 0, 5.0), queue="csl-late")
    assert wait_for(lambda: data.llen(f"runs:{name}") == 1, timeout=20)
    captured: list[tuple[Any, ...]] = []

    def grab(body: Any = None, headers: Any = None, **more: Any) -> None:
        captured.append((body, dict(headers or {}), dict(more.get("properties") or {})))

    signals.before_task_publish.connect(grab, weak=False)
    try:
        call = keep.ordered_job.delay(name, 1, seconds)
    finally:
        signals.before_task_publish.disconnect(grab)
    assert wait_for(lambda: call.state == "PARKED", timeout=30), call.state
    parker.stop()  # the handed copy will wait in the default queue
    assert wait_for(lambda: data.llen(f"runs:{name}") == 1 and data.get(f"inside:{name}") == "0",
                    timeout=20)  # fmt: skip
    return call, captured


def _publish_copy(keep: ModuleType, captured: list[tuple[Any, ...]]) -> None:
    with keep.app.producer_or_acquire() as producer:
        for body, headers, properties in captured:
            kept = {k: v for k, v in properties.items() if k in ("correlation_id", "reply_to")}
            producer.publish(body, routing_key="csl-copy", headers=headers, serializer="json",
                             **kept)  # fmt: skip


def test_a_handed_call_whose_copy_ran_first_does_not_run_again(
    keep: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker]
) -> None:
    """A call published twice (the same task id, as a redelivery does) parks; when the key
    is handed to it, its second copy is delivered first, takes the grant and runs. The
    handed copy, delivered after that while another run holds the key, ends without
    parking again: the call runs once."""
    name = "o6"
    call, captured = _copy_takes_the_grant(keep, data, workers, name, 0.1)
    holder = keep.ordered_job.apply_async((name, 2, 3.0), queue="csl-late")
    assert wait_for(lambda: holder.state == "PARKED", timeout=30), holder.state
    _publish_copy(keep, captured)
    workers(concurrency=1, app=APP, queues=("csl-copy",))
    assert call.get(timeout=20) == 1
    assert wait_for(lambda: _order(data, name) == [0, 1, 2], timeout=20), _order(data, name)
    workers(concurrency=1, app=APP)  # the handed copy is delivered while the key is held
    assert holder.get(timeout=20) == 2
    time.sleep(2.0)
    assert _order(data, name) == [0, 1, 2]
    assert call.get(timeout=30) == 1


def test_a_handed_call_delivered_while_its_copy_runs_does_not_run_again(
    keep: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker]
) -> None:
    """As above, but the handed copy is delivered while the copy that took its grant still
    runs: it comes back later (a delivery of a running message), and then ends without
    running: the call runs once."""
    name = "o7"
    call, captured = _copy_takes_the_grant(keep, data, workers, name, 3.0)
    _publish_copy(keep, captured)
    workers(concurrency=1, app=APP, queues=("csl-copy",))
    assert wait_for(lambda: _order(data, name) == [0, 1], timeout=20), _order(data, name)
    workers(concurrency=1, app=APP)  # the handed copy is delivered while the copy runs
    assert call.get(timeout=20) == 1
    time.sleep(4.0)
    assert _order(data, name) == [0, 1]
    assert data.get(f"over:{name}") is None
