"""The explanation driver over the modes' state faces (issue 33), against a real Redis:
every part of a key read in two pipelined round trips at most (one when nothing but a
holder is there), each part from its face, and the faces' registry in the order the
explanation lists parts and states."""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from celery_singleton_lock import RedisLock
from celery_singleton_lock.engine import atomic
from celery_singleton_lock.engine.keyspace import (
    DEBOUNCE,
    PARKDATA,
    PARKED,
    PENDING,
    companion_key,
)
from celery_singleton_lock.engine.stack import Limit, Stack, stack_base
from celery_singleton_lock.explain import STATES, Explanation, explain_key
from celery_singleton_lock.modes import FACES
from celery_singleton_lock.options import LockOptions
from celery_singleton_lock.testing import RedisServer


class CountingRedis(redis.Redis):
    """A client that counts the pipelines it executes (its round trips)."""

    executed = 0

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        pipe = super().pipeline(transaction, shard_hint)
        execute = pipe.execute

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.executed += 1
            return execute(*args, **kwargs)

        pipe.execute = counted  # type: ignore[method-assign]
        return pipe


@pytest.fixture
def counting(redis_server: RedisServer) -> Iterator[CountingRedis]:
    conn = CountingRedis.from_url(redis_server.url, socket_connect_timeout=2)
    yield conn
    conn.close()


def test_a_key_with_only_a_holder_is_read_in_one_round_trip(counting: CountingRedis) -> None:
    key = f"test:{uuid.uuid4().hex[:12]}"
    holder = RedisLock(counting, key, timeout=30.0, holder_info={"task_id": "t-1"})
    assert holder.acquire(blocking=False)
    try:
        counting.executed = 0
        found = explain_key(counting, key)
        assert counting.executed == 1
        assert (found.state, [h.task_id for h in found.holders]) == ("held", ["t-1"])
    finally:
        holder.release()


def test_every_face_in_two_round_trips(counting: CountingRedis) -> None:
    """A key with a holder, a parked call, a pending follow-up, a used-up rate, an open
    burst and a full stacked limit: every face fills its part and adds its state, in the
    registry's order, in two round trips; the JSON reads back to the same explanation."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    key = f"{prefix}:job:main:{{{prefix}:stack}}"  # the stack's hash tag

    def companion(suffix: str) -> str:
        return companion_key(key, suffix)

    stack = Stack(stack_base(prefix), (Limit("global", "global", 1),), 1)
    holder = RedisLock(
        counting, key, timeout=30.0, holder_info={"task_id": "t-1", "task": "shop.buy"}
    )
    assert holder.acquire(blocking=False)
    other = RedisLock(counting, f"{prefix}:job:other:{{{prefix}:stack}}", timeout=30.0, stack=stack)
    assert other.acquire(blocking=False)  # the limit of one is used
    seconds, micros = counting.time()
    now_us = seconds * 1_000_000 + micros
    try:
        counting.zadd(companion(PARKED), {"t-parked": now_us - 1_000_000})
        info = json.dumps({"task": "shop.buy", "task_id": "t-parked"})
        counting.hset(companion(PARKDATA), "t-parked", f"token\n{info}\ncall")
        counting.hset(companion(PENDING), mapping={"id": "t-next", "info": info})
        due = now_us // 1000 + 30_000
        counting.hset(
            companion(DEBOUNCE),
            mapping={"id": "t-burst", "gen": 2, "first": now_us // 1000, "due": due},
        )
        for run in ("run-1", "run-2"):
            assert atomic.throttle(counting, key, limit=2, window_ms=60_000, member=run) is None
        options = dataclasses.replace(LockOptions(), rate_limit="2/m")
        counting.executed = 0
        found = explain_key(counting, key, options, task="shop.buy", stack=stack)
        assert counting.executed == 2
    finally:
        holder.release()
        other.release()
        counting.delete(*(companion(s) for s in (PARKED, PARKDATA, PENDING, DEBOUNCE)))
    assert found.states == ("held", "parked", "throttled", "debouncing", "limited")
    assert list(found.states) == [state for state in STATES if state in found.states]
    assert [(p.position, p.task_id, p.task) for p in found.parked] == [(1, "t-parked", "shop.buy")]
    assert found.follow_up is not None
    assert found.follow_up.task_id == "t-next"
    assert found.throttle is not None
    assert found.throttle.count == 2
    assert found.debounce is not None
    assert (found.debounce.task_id, found.debounce.calls) == ("t-burst", 2)
    assert [(use.name, use.used, use.fits) for use in found.limits] == [("global", 1, False)]
    assert Explanation.from_json(found.as_json()) == found
    assert list(found.as_json()) == [
        "key", "task", "state", "states", "now",
        *(name for face in FACES for name in face.as_json(found)),
    ]  # fmt: skip
    assert list(found.as_json())[5:] == [
        "slots", "holders", "waiters", "waiting", "parked", "parked_total", "handed",
        "follow_up", "throttle", "debounce", "limits",
    ]  # fmt: skip
