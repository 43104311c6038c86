"""Stacked limits (lock_limits, lock_weight) on real workers: one export per report, two
(weighted) per tenant, five in all. Across three workers and 1,000 runs the limits are never
exceeded, a limit lowered in Redis holds new runs back without a restart, a SIGKILLed run's
shares come back in every limit, and a run held back by a limit meets its conflict policy."""

from __future__ import annotations

import importlib
import os
import signal
import time
from types import ModuleType
from typing import Any

import pytest
import redis

from celery_singleton_lock import RedisLock, TaskLocked, WeightAboveLimit
from celery_singleton_lock.engine.stack import stack_base
from celery_singleton_lock.explain import Explanation
from celery_singleton_lock.runtime.locking import locking_for
from celery_singleton_lock.testing import RedisServer
from tests.worker.conftest import wait_for

pytestmark = pytest.mark.slow

APP = "tests.worker.stack_proj"


@pytest.fixture(scope="module")
def sp(worker_redis: RedisServer) -> ModuleType:
    """The stack project, pointed at the session's server."""
    os.environ["CSL_BROKER_URL"] = worker_redis.url
    os.environ["CSL_BACKEND_URL"] = worker_redis.url.replace("/0", "/1")
    return importlib.import_module(APP)


def _peaks(data: redis.Redis, tenants: int) -> dict[str, int]:
    names = [f"peak:t{i}" for i in range(tenants)] + ["peak:all"]
    return {name: int(data.get(name) or 0) for name in names}


def test_a_thousand_runs_never_exceed_a_limit(
    sp: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """1,000 exports of 40 reports over 4 tenants, one in four heavy (weight 2), on three
    prefork workers of three processes: the weight inside a tenant never passes 2 and in all
    never passes 5, both limits were full at some moment, no report ran twice at once, and
    every run ended."""
    for _ in range(3):
        workers(concurrency=3, app=APP)
    results = [
        sp.export.delay(f"r{i % 40}", f"t{i % 4}", 500 if i % 4 == 0 else 5, 0.01)
        for i in range(1000)
    ]
    assert wait_for(lambda: int(data.get("done") or 0) == 1000, timeout=420, interval=0.5), (
        data.get("done")
    )
    peaks = _peaks(data, 4)
    assert all(peaks[f"peak:t{i}"] <= 2 for i in range(4)), peaks
    assert peaks["peak:all"] == 5, peaks  # full at some moment: more would have been seen
    assert max(peaks[f"peak:t{i}"] for i in range(4)) == 2
    assert data.get("report-overlap") is None
    assert all(result.get(timeout=30) == "ran" for result in results[-10:])
    base = stack_base("csl")
    assert data.zcard(base + "limit:global:exports") == 0  # every share given back


def test_a_lowered_limit_holds_new_runs_back_without_a_restart(
    sp: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """`locks limit set tenant:{tenant} 1` while two runs of tenant t0 are inside: both go
    on; from then on tenant t0 has one run at a time, and after `unset` two again."""
    workers(concurrency=4, app=APP)
    capacities = stack_base("csl") + "limits"
    first = [sp.export.delay(f"a{i}", "t0", 1, 2.0) for i in range(2)]
    assert wait_for(lambda: int(data.get("in:t0") or 0) == 2, timeout=30)
    data.hset(capacities, "tenant:{tenant}", 1)
    for result in first:
        assert result.get(timeout=30) == "ran"  # lowering stops nothing
    data.delete("peak:t0")
    later = [sp.export.delay(f"b{i}", "t0", 1, 0.3) for i in range(4)]
    for result in later:
        assert result.get(timeout=60) == "ran"
    assert int(data.get("peak:t0") or 0) == 1
    data.hdel(capacities, "tenant:{tenant}")
    data.delete("peak:t0")
    # 2 s runs on four processes: two of them surely overlap (1 s left little room for a
    # busy machine's dispatch)
    again = [sp.export.delay(f"c{i}", "t0", 1, 2.0) for i in range(4)]
    for result in again:
        assert result.get(timeout=60) == "ran"
    assert int(data.get("peak:t0") or 0) == 2


def test_a_killed_runs_shares_come_back_in_every_limit(
    sp: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """A heavy run (weight 2) fills tenant t1 and part of the global budget; its pool
    process is SIGKILLed. A new heavy run of t1 gets in once the dead run's 3 s lease has
    ended (bounded generously, 60 s: a share that never ended would keep it out), and the
    dead run's share is gone from both limits."""
    worker = workers(concurrency=3, app=APP)
    victim_run = sp.export.delay("k1", "t1", 500, 60.0)
    assert wait_for(lambda: data.llen("pids:t1") == 1, timeout=30)
    victim = int(data.lindex("pids:t1", 0) or 0)
    assert victim in worker.children()
    base = stack_base("csl")
    assert data.zcard(base + "limit:tenant:t1") == 1
    os.kill(victim, signal.SIGKILL)
    data.decrby("in:t1", 2)  # the killed run never leaves its section: count it out
    data.decrby("in:all", 2)
    data.decr("in-report:k1")
    nxt = sp.export.delay("k2", "t1", 500, 0.0)
    assert nxt.get(timeout=60) == "ran"
    assert int(data.get("peak:t1") or 0) == 2
    assert data.zcard(base + "limit:tenant:t1") == 0
    assert data.zcard(base + "limit:global:exports") == 0
    victim_run.forget()


def test_a_run_held_back_by_a_limit_meets_its_policy(
    sp: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """With tenant t2 full, a skip-policy export of another report of t2 is skipped (its
    own key was free), while one of tenant t3 runs."""
    workers(concurrency=4, app=APP)
    capacities = stack_base("csl") + "limits"
    data.hset(capacities, "tenant:t2", 1)
    holder = sp.export.delay("s1", "t2", 1, 3.0)
    assert wait_for(lambda: int(data.get("in:t2") or 0) == 1, timeout=30)
    skipped = sp.export_or_skip.delay("s2", "t2")
    assert skipped.get(timeout=30) is None
    assert int(data.get("done") or 0) == 0
    other = sp.export_or_skip.delay("s3", "t3")
    assert other.get(timeout=30) == "ran"
    assert holder.get(timeout=30) == "ran"
    data.delete(capacities)


def test_a_limit_that_holds_a_run_back_is_named(sp: ModuleType, data: redis.Redis) -> None:
    """A raise-policy run whose key is free but whose tenant is full fails with TaskLocked
    naming that limit, its explanation lists every limit of the call (state "limited"), and
    lock_explain says the same before the call is made; a run of a free tenant is not
    limited. (Eager runs in this process, on the real lock Redis; the call weighs 1, as a
    weight above the tenant's number would be refused outright, WeightAboveLimit.)"""
    capacities = stack_base("csl") + "limits"
    data.hset(capacities, "tenant:t5", 1)
    holder = RedisLock(
        redis.Redis.from_url(sp.BROKER),
        sp.export_or_raise.lock_key("h", "t5"),
        timeout=30,
        stack=locking_for(sp.export_or_raise).stack(("h", "t5"), {}),
    )
    assert holder.acquire(blocking=False)
    try:
        explanation = sp.export_or_raise.lock_explain("x", "t5")
        assert explanation.state == "limited"
        uses = {use.name: use for use in explanation.limits}
        assert uses["tenant:t5"].number == 1
        assert uses["tenant:t5"].source == "name"
        assert uses["tenant:t5"].used == 1
        assert uses["tenant:t5"].weight == 1
        assert not uses["tenant:t5"].fits
        assert uses["global:exports"].fits
        assert "Limit" in str(explanation)
        result = sp.export_or_raise.apply(("x", "t5"))
        assert isinstance(result.result, TaskLocked)
        assert "tenant:t5" in str(result.result)
        assert result.result.task_id is None
        carried = Explanation.from_json(result.result.explanation)
        assert carried.state == "limited"
        assert sp.export_or_raise.apply(("y", "t6")).get() == "ran"
    finally:
        holder.release()
        data.delete(capacities)


def test_queue_scope_keeps_the_accepted_call_until_it_fits(
    sp: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """Queue scope: with tenant t7 full, a call is accepted and its duplicate gets its
    AsyncResult; its run is held back and comes back (its hold following it) until the
    tenant has room, then runs once. Under "raise" the run fails with TaskLocked naming the
    limit and gives its hold up, so the next call is published anew."""
    workers(concurrency=2, app=APP)
    capacities = stack_base("csl") + "limits"
    data.hset(capacities, "tenant:t7", 1)
    client = redis.Redis.from_url(sp.BROKER)
    holder = RedisLock(
        client,
        sp.export.lock_key("hold", "t7"),
        timeout=30,
        stack=locking_for(sp.export).stack(("hold", "t7"), {}),
    )
    assert holder.acquire(blocking=False)
    try:
        first = sp.export_queued.delay("q1", "t7")
        assert sp.export_queued.delay("q1", "t7").id == first.id  # a duplicate: deduplicated
        time.sleep(2.0)
        assert first.state != "SUCCESS"
        assert int(data.get("done") or 0) == 0
        failing = sp.export_queued_or_raise.delay("q2", "t7")
        with pytest.raises(TaskLocked, match="tenant:t7"):
            failing.get(timeout=30)
        again = sp.export_queued_or_raise.delay("q2", "t7")
        assert again.id != failing.id  # the failed call gave its hold up
    finally:
        holder.release()
    assert first.get(timeout=30) == "ran"
    again.get(timeout=30, propagate=False)  # ran, or held back by first: raised
    assert again.state in {"SUCCESS", "FAILURE"}
    assert int(data.get("done") or 0) >= 1
    data.delete(capacities)


def test_coalesce_hands_the_key_and_the_follow_up_takes_its_shares(
    sp: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """Keep latest with stacked limits: while the first call runs, two more become one
    follow-up (latest arguments); the tenant's number is lowered to 0 meanwhile, so when
    the first run ends (its shares given back in the hand-over) the follow-up, handed the
    key, is held back and comes back with its hold; raised to 1, it runs once, with the
    latest arguments, and every share is given back at the end."""
    workers(concurrency=2, app=APP)
    capacities = stack_base("csl") + "limits"
    first = sp.export_latest.delay("c1", "t8", 1, 1.5)
    assert wait_for(lambda: int(data.get("in:t8") or 0) == 1, timeout=30)
    second = sp.export_latest.delay("c1", "t8", 2)
    third = sp.export_latest.delay("c1", "t8", 3)
    assert second.id == third.id != first.id
    data.hset(capacities, "tenant:t8", 0)
    try:
        assert first.get(timeout=30) == 1
        time.sleep(1.5)
        assert data.lrange("values:c1", 0, -1) == ["1"]  # the follow-up is held back
        assert data.zcard(stack_base("csl") + "limit:tenant:t8") == 0
    finally:
        data.hset(capacities, "tenant:t8", 1)
    assert third.get(timeout=30) == 3
    assert data.lrange("values:c1", 0, -1) == ["1", "3"]
    assert data.zcard(stack_base("csl") + "limit:tenant:t8") == 0
    assert data.zcard(stack_base("csl") + "limit:global:exports") == 0
    data.delete(capacities)


def test_replace_running_frees_the_revoked_runs_shares(
    sp: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """Replace with lock_replace_running: a call made while the first runs revokes it
    (terminate); the new call runs once that run has stopped (its tenant's number is 1:
    it could not get in while the revoked run's share was held), and the revoked run's
    shares are gone from every limit."""
    workers(concurrency=2, app=APP)
    capacities = stack_base("csl") + "limits"
    data.hset(capacities, "tenant:t9", 1)
    try:
        first = sp.export_replacing.delay("p1", "t9", 1, 60.0)
        assert wait_for(lambda: int(data.get("in:t9") or 0) == 1, timeout=30)
        second = sp.export_replacing.delay("p1", "t9", 2)
        assert second.get(timeout=60) == 2
        assert first.state == "REVOKED"
        assert data.lrange("values:p1", 0, -1) == ["1", "2"]
        assert data.zcard(stack_base("csl") + "limit:tenant:t9") == 0
        assert data.zcard(stack_base("csl") + "limit:global:exports") == 0
    finally:
        data.delete(capacities)


def test_a_parked_call_holds_no_share_and_runs_when_its_limits_have_room(
    sp: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """Park with a tenant of 1: a second export of another report, its key free, is held
    back by the tenant: it shows PARKED, holds no share and no worker meanwhile, and runs
    once the first has ended, never beside it."""
    workers(concurrency=2, app=APP)
    capacities = stack_base("csl") + "limits"
    data.hset(capacities, "tenant:t10", 1)
    try:
        first = sp.export_parked.delay("a", "t10", 1, 3.0)
        assert wait_for(lambda: int(data.get("in:t10") or 0) == 1, timeout=30)
        second = sp.export_parked.delay("b", "t10")
        assert wait_for(lambda: second.state == "PARKED", timeout=30)
        assert data.zcard(stack_base("csl") + "limit:tenant:t10") == 1  # first's only
        assert first.get(timeout=30) == "ran"
        assert second.get(timeout=30) == "ran"
        assert int(data.get("peak:t10") or 0) == 1
        assert data.lrange("order:t10", 0, -1) == ["a", "b"]
    finally:
        data.delete(capacities)


def test_a_heavy_parked_call_is_not_starved_by_light_ones(
    sp: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """A steady stream of light exports (weight 1) keeps tenant t11 (number 2) busy for
    about eight seconds; a heavy one (weight 2, which needs the tenant empty) made early in
    the stream still runs well before the stream ends: its place in the tenant's line makes
    the light ones that come after it wait until it got in."""
    workers(concurrency=3, app=APP)
    workers(concurrency=3, app=APP)
    lights = []
    heavy = None
    started = time.monotonic()
    for index in range(40):
        lights.append(sp.export_parked.delay(f"l{index}", "t11", 1, 0.4))
        if index == 5:
            heavy = sp.export_parked.delay("heavy", "t11", 500, 0.2)
        time.sleep(max(0.0, started + (index + 1) * 0.2 - time.monotonic()))
    assert heavy is not None
    assert heavy.get(timeout=120) == "ran"
    for result in lights:
        assert result.get(timeout=120) == "ran"
    order = data.lrange("order:t11", 0, -1)
    assert int(data.get("peak:t11") or 0) <= 2
    assert order.index("heavy") < len(order) - 10, order  # not left for the very end


@pytest.mark.parametrize("task", ["export_weighing", "export_weighing_parked"])
def test_a_weight_above_its_limits_number_fails_naming_the_limit(
    sp: ModuleType, data: redis.Redis, workers: Any, task: str
) -> None:
    """Under "wait" (lock_wait 600 s) and "park", a run whose weight is above a limit's
    number, as it applies (the code's 2 for tenant t20; 1 set in Redis for tenant t21),
    fails at once with WeightAboveLimit naming the limit, its number and the weight, and
    leaves no share, no place in a line and nothing parked; a weight that fits the number
    set in Redis above the code's (5 for tenant t22) runs."""
    workers(concurrency=2, app=APP)
    export = getattr(sp, task)
    base = stack_base("csl")
    capacities = base + "limits"
    data.hset(capacities, mapping={"tenant:t21": 1, "tenant:t22": 5})
    try:
        cases = [("t20", 3, 2), ("t21", 2, 1)]
        for tenant, weight, number in cases:
            result = export.delay(f"heavy-{tenant}", tenant, weight)
            assert wait_for(lambda result=result: result.ready(), timeout=60), result.state
            assert result.state == "FAILURE"
            error = result.result
            assert isinstance(error, WeightAboveLimit), repr(error)
            assert (error.limit, error.number, error.weight) == (f"tenant:{tenant}", number, weight)
            assert f"'tenant:{tenant}'" in str(error)
            for limit in (f"tenant:{tenant}", "global:exports"):
                assert data.zcard(base + f"limit:{limit}") == 0
                assert data.zcard(base + f"line:{limit}") == 0
            assert data.zcard(base + "held") == 0
        assert export.delay("heavy-t22", "t22", 3).get(timeout=60) == "ran"
        assert int(data.get("peak:t22") or 0) == 3
        assert int(data.get("done") or 0) == 1  # the refused runs never ran
    finally:
        data.delete(capacities)


def test_a_refused_weight_gives_back_the_key_it_was_handed(
    sp: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """A run refused for its weight gives back the key it held when it started: one parked
    behind a running call of its report (handed the key when that call ends), and a
    queue-scope one (holding its key from publish). Once it has failed, its key is free."""
    workers(concurrency=2, app=APP)
    first = sp.export_weighing_parked.delay("handed", "t23", 1, 2.0)
    assert wait_for(lambda: int(data.get("in:t23") or 0) == 1, timeout=30)
    heavy = sp.export_weighing_parked.delay("handed", "t23", 3)
    assert wait_for(lambda: heavy.state == "PARKED", timeout=30)
    assert first.get(timeout=30) == "ran"
    assert wait_for(heavy.ready, timeout=60), heavy.state
    assert isinstance(heavy.result, WeightAboveLimit), repr(heavy.result)
    key = locking_for(sp.export_weighing_parked).key(("handed", "t23", 3), {})
    assert data.get(key) is None
    queued = sp.export_weighing_queued.delay("queued", "t24", 3)
    assert wait_for(queued.ready, timeout=60), queued.state
    assert isinstance(queued.result, WeightAboveLimit), repr(queued.result)
    key = locking_for(sp.export_weighing_queued).key(("queued", "t24", 3), {})
    assert data.get(key) is None


def test_a_held_back_call_whose_limit_is_lowered_below_its_weight_fails(
    sp: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """Park: a weight-2 call held back by its full tenant (number 2) waits in the lock
    Redis; the tenant is lowered to 1 meanwhile, so it could never get in: once the running
    call ends, it is published and fails with WeightAboveLimit instead of staying PARKED."""
    workers(concurrency=2, app=APP)
    base = stack_base("csl")
    capacities = base + "limits"
    first = sp.export_weighing_parked.delay("a", "t25", 2, 2.0)
    assert wait_for(lambda: int(data.get("in:t25") or 0) == 2, timeout=30)
    held = sp.export_weighing_parked.delay("b", "t25", 2)
    assert wait_for(lambda: held.state == "PARKED", timeout=30)
    data.hset(capacities, "tenant:t25", 1)
    try:
        assert first.get(timeout=30) == "ran"
        assert wait_for(held.ready, timeout=60), held.state
        assert isinstance(held.result, WeightAboveLimit), repr(held.result)
        assert (held.result.limit, held.result.number) == ("tenant:t25", 1)
        assert data.zcard(base + "held") == 0
        assert data.zcard(base + "line:tenant:t25") == 0
    finally:
        data.delete(capacities)
