"""The park queue and the line of a key (``lock_on_conflict="park"``, ``lock_order``) at the
level of their scripts, on a real redis-server: who parks, who is handed the key, in which
order, and what a line does with a call that went missing."""

from __future__ import annotations

import json
import time

import pytest
import redis

from celery_singleton_lock import RedisLock
from celery_singleton_lock.engine import atomic
from celery_singleton_lock.engine.keyspace import DONE, ORDER, PARKED, companion_key
from celery_singleton_lock.engine.value import parse_value
from celery_singleton_lock.modes.park import priority_rank
from celery_singleton_lock.modes.scope import queue_token, task_group

KEEP = 60_000


def _park(client: redis.Redis, key: str, task_id: str, *, turn: int | None = None,
          ordered: bool = False, slots: int = 1) -> atomic.Parked:  # fmt: skip
    info = json.dumps({"task_id": task_id, "queued": True})
    return atomic.park(client, key, task_id, turn=turn, token=queue_token(task_id, slots),
                       info=info, payload=f"call {task_id}".encode(), keep_ms=KEEP,
                       grant_ms=KEEP, slots=slots, ordered=ordered)  # fmt: skip


def _holder(client: redis.Redis, key: str, task_id: str) -> RedisLock:
    lock = RedisLock(client, key, timeout=30, token=queue_token(task_id, 1),
                     holder_info={"task_id": task_id})  # fmt: skip
    assert lock.acquire(blocking=False)
    return lock


def _take(client: redis.Redis, key: str, task_id: str, rank: int = 0) -> int:
    return atomic.order_take(client, key, task_id, rank=rank, keep_ms=KEEP)


def test_calls_park_behind_a_holder_and_are_handed_the_key_in_order(
    client: redis.Redis, key: str
) -> None:
    """Behind a holder, calls park at positions 1, 2, 3; each release hands the key to the
    next, written under its grant token with a larger fencing token, and returns the call
    to publish; the last release frees the key."""
    holder = _holder(client, key, "h")
    assert [_park(client, key, f"c{n}").position for n in (1, 2, 3)] == [1, 2, 3]
    fence = holder.fencing_token
    ending = holder
    for name in ("c1", "c2", "c3"):
        handed = atomic.park_release(ending, KEEP)
        assert isinstance(handed, atomic.ParkedCall)
        assert (handed.task_id, handed.payload) == (name, f"call {name}".encode())
        value = parse_value(client.get(key))
        assert value is not None
        assert value.token == queue_token(name, 1)
        assert value.fence is not None
        assert fence is not None
        assert value.fence > fence
        fence = value.fence
        ending = RedisLock(client, key, token=queue_token(name, 1))
    assert atomic.park_release(ending, KEEP) == 1
    assert client.get(key) is None


def test_a_newcomer_does_not_barge_past_parked_calls(client: redis.Redis, key: str) -> None:
    """The key is free (its holder's lease ran out) while a call is parked: a newcomer that
    would park finds the parked call handed the key, and parks behind it."""
    lock = RedisLock(client, key, timeout=0.5, holder_info={"task_id": "h"})
    assert lock.acquire(blocking=False)
    assert _park(client, key, "c1").position == 1
    time.sleep(0.6)
    came = _park(client, key, "late")
    assert came.handed is not None
    assert came.handed.task_id == "c1"
    assert came.position == 1
    assert client.zrange(companion_key(key, PARKED), 0, -1) == [b"late"]


def test_the_line_orders_by_priority_then_by_call(client: redis.Redis, key: str) -> None:
    """Turns: rank 0 before rank 5, in call order within a rank; a call keeps its turn when
    it asks again."""
    first = _take(client, key, "a", rank=5)
    second = _take(client, key, "b", rank=5)
    urgent = _take(client, key, "c", rank=0)
    assert urgent < first < second
    assert _take(client, key, "a", rank=0) == first
    assert client.zrange(companion_key(key, ORDER), 0, -1) == [b"c", b"a", b"b"]


def test_a_call_ahead_of_its_turn_parks_even_on_a_free_key(client: redis.Redis, key: str) -> None:
    """Ordered: b's turn comes after a's, whose message has not come: b parks on the free
    key; when a runs and releases, the key is handed to b in the same step."""
    turns = {name: _take(client, key, name) for name in ("a", "b")}
    assert atomic.order_turn(client, key, "b", turn=turns["b"], slots=1, keep_ms=KEEP,
                             lease_ms=KEEP) == 0  # fmt: skip
    assert _park(client, key, "b", turn=turns["b"], ordered=True).position == 1
    assert client.get(key) is None  # nobody holds it: b waits for its turn
    assert atomic.order_turn(client, key, "a", turn=turns["a"], slots=1, keep_ms=KEEP,
                             lease_ms=KEEP) == 1  # fmt: skip
    a = _holder(client, key, "a")
    handed = atomic.park_release(a, KEEP, ordered="a")
    assert isinstance(handed, atomic.ParkedCall)
    assert handed.task_id == "b"
    assert client.zrange(companion_key(key, ORDER), 0, -1) == [b"b"]


def test_a_missing_call_leaves_the_line_when_its_place_runs_out(
    client: redis.Redis, key: str
) -> None:
    """a took its turn but its message never comes: after its place ran out, the sweep
    hands the key to b, parked behind it; when a's message comes after all, it is back at
    its old turn, ahead of any later call."""
    a_turn = atomic.order_take(client, key, "a", rank=0, keep_ms=300)
    b_turn = _take(client, key, "b")
    _park(client, key, "b", turn=b_turn, ordered=True)
    active, calls = atomic.park_sweep(client, key, restart_ms=KEEP, grant_ms=KEEP, most=10,
                                      ordered=True)  # fmt: skip
    assert (active, calls) == (True, [])
    time.sleep(0.4)
    active, calls = atomic.park_sweep(client, key, restart_ms=KEEP, grant_ms=KEEP, most=10,
                                      ordered=True)  # fmt: skip
    assert [call.task_id for call in calls] == ["b"]
    _take(client, key, "c")
    assert atomic.order_turn(client, key, "a", turn=a_turn, slots=1, keep_ms=KEEP,
                             lease_ms=KEEP) == 1  # fmt: skip


def test_a_finished_call_is_a_late_copy_and_leave_drops_a_turn(
    client: redis.Redis, key: str
) -> None:
    """A task id in the done set is a late copy (-1); a call that leaves the line (revoked)
    no longer holds up the next one."""
    client.zadd(companion_key(key, DONE), {"done": 1})
    assert atomic.order_turn(client, key, "done", turn=1, slots=1, keep_ms=KEEP,
                             lease_ms=KEEP) == -1  # fmt: skip
    turns = {name: _take(client, key, name) for name in ("x", "y")}
    assert atomic.order_turn(client, key, "y", turn=turns["y"], slots=1, keep_ms=KEEP,
                             lease_ms=KEEP) == 0  # fmt: skip
    assert atomic.order_leave(client, key, "x")
    assert atomic.order_turn(client, key, "y", turn=turns["y"], slots=1, keep_ms=KEEP,
                             lease_ms=KEEP) == 1  # fmt: skip


@pytest.mark.parametrize(
    ("broker", "priority", "rank"),
    [
        ("redis://h/0", 0, 0), ("redis://h/0", 9, 9), ("redis://h/0", None, 0),
        ("amqp://h//", 255, 0), ("amqp://h//", 0, 255), ("amqp://h//", None, 255),
        ("sentinel://h", 3, 3), ("redis://h/0", "junk", 0), ("amqp://h//", 999, 0),
    ],
)  # fmt: skip
def test_priority_rank_reads_priority_as_the_broker_does(
    broker: str, priority: object, rank: int
) -> None:
    """On Redis a lower number goes first, on AMQP a higher; junk is no priority."""

    class App:
        class conf:  # noqa: N801 - stands for Celery's app.conf
            broker_url = broker

    assert priority_rank(App(), priority) == rank


@pytest.mark.parametrize("slots", [1, 3])
def test_a_grant_another_copy_of_the_call_took_is_not_handed_out_again(
    client: redis.Redis, key: str, slots: int
) -> None:
    """A call handed the key whose grant another copy of its message (the same task id)
    took over and runs under a token of its own has started: the sweep does not publish it
    again once the grant is stale. A grant nobody took is published again."""
    holder = RedisLock(client, key, timeout=30, limit=slots, holder_info={"task_id": "h"})
    assert holder.acquire(blocking=False)
    others = []
    for n in range(slots - 1):
        other = RedisLock(client, key, timeout=30, limit=slots, holder_info={"task_id": f"o{n}"})
        assert other.acquire(blocking=False)
        others.append(other)
    assert _park(client, key, "c1", slots=slots).position == 1
    assert _park(client, key, "c2", slots=slots).position == 2
    assert isinstance(atomic.park_release(holder, KEEP), atomic.ParkedCall)
    copy = RedisLock(client, key, timeout=30, limit=slots, claim=queue_token("c1", slots),
                     group=task_group("c1") if slots > 1 else None,
                     holder_info={"task_id": "c1", "pid": 2})  # fmt: skip
    assert copy.acquire(blocking=False)
    sweep = {"restart_ms": 0, "grant_ms": KEEP, "most": 10, "slots": slots}
    assert atomic.park_sweep(client, key, **sweep) == (True, [])  # c1 runs: nothing to publish
    assert isinstance(atomic.park_release(copy, KEEP), atomic.ParkedCall)  # to c2
    handed = atomic.park_sweep(client, key, **sweep)[1]  # c2's grant went stale: again
    assert [call.task_id for call in handed] == ["c2"]
