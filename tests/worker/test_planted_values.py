"""Values planted at a task's lock key, on a real worker: never a stuck worker.

Every Redis type, garbage with and without a TTL, classic timestamps ahead and behind,
negative and oversized numbers, our own layout with a far-future lease or an exhausted
fencing counter. A held value makes the run skip (or a bounded wait give up with
TaskLocked); an abandoned one of ours (or a classic timestamp in the past) is taken over
and the body runs; a value the lock cannot use, or that it cannot have written and that has
no TTL (never overwritten silently), makes the run fail closed with a clear error in the
log (it never runs unlocked), the worker keeps serving other tasks, and the run goes
through once the key is cleaned up.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
import redis

from celery_singleton_lock import TaskLocked
from tests.worker.conftest import wait_for

pytestmark = pytest.mark.slow

Plant = Callable[[redis.Redis, str], object]


def _now_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


PLANTS: dict[str, tuple[Plant, str]] = {
    "list": (lambda r, k: r.rpush(k, "x"), "error"),
    "hash": (lambda r, k: r.hset(k, "f", "x"), "error"),
    "set": (lambda r, k: r.sadd(k, "x"), "error"),
    "zset": (lambda r, k: r.zadd(k, {"x": 1}), "error"),
    "stream": (lambda r, k: r.xadd(k, {"f": "x"}), "error"),
    "garbage-with-ttl": (lambda r, k: r.set(k, b"\xff\x00{garbage", px=60_000), "held"),
    "garbage-without-ttl": (lambda r, k: r.set(k, b"\xff\x00{garbage"), "error"),
    "classic-ahead-s": (lambda r, k: r.set(k, str(_now_ms(r) // 1000 + 3600)), "held"),
    "classic-behind-ms": (lambda r, k: r.set(k, str(_now_ms(r) - 5000)), "ran"),
    "negative": (lambda r, k: r.set(k, "-17"), "error"),
    "oversized-number": (lambda r, k: r.set(k, "9" * 30), "error"),
    "ours-far-future": (lambda r, k: r.set(k, f"{_now_ms(r) + 10**9}:0:tok:5:{{}}"), "held"),
    "ours-fence-exhausted": (
        lambda r, k: r.set(k, f"{_now_ms(r) - 1000}:0:tok:{2**53 - 1}:{{}}"),
        "error",
    ),
}


def test_planted_values_never_stick_a_worker(
    proj: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """For each planted value the run skips, runs, or fails closed with a clear error
    naming the key, within a bounded time; the worker keeps serving other tasks; a run that
    failed closed goes through once the key is deleted."""
    worker = workers(concurrency=2)
    tag = uuid.uuid4().hex[:6]
    sent: dict[str, tuple[Any, str, str]] = {}
    for case, (plant, expected) in PLANTS.items():
        name = f"planted-{case}-{tag}"
        key = proj.skippy.lock_key(name, 0.1)
        plant(data, key)
        sent[case] = (proj.skippy.delay(name, 0.1), key, expected)
    for case, (result, key, expected) in sent.items():
        if expected == "held":
            assert result.get(timeout=20) is None, case  # skipped: the planted holder wins
            assert data.llen(f"events:planted-{case}-{tag}") == 0, case
            assert data.exists(key), case  # never deleted blind
        elif expected == "ran":
            assert result.get(timeout=20) == "ran", case
    failing = {case: item for case, item in sent.items() if item[2] == "error"}
    for case, (_, key, _) in failing.items():
        assert wait_for(lambda key=key: key in worker.log(), timeout=20), case
    assert proj.skippy.delay(f"control-{tag}", 0.1).get(timeout=20) == "ran"
    log = worker.log()
    assert "WRONGTYPE" in log
    assert "fencing" in log.lower()
    time.sleep(1.0)
    for case in failing:
        assert data.llen(f"events:planted-{case}-{tag}") == 0, f"{case} ran unlocked"
    for _, key, _ in failing.values():
        data.delete(key)
    for case, (result, _, _) in failing.items():
        assert result.get(timeout=40) == "ran", case


def test_a_bounded_wait_behind_a_planted_holder_gives_up_on_time(
    proj: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """A wait-policy run behind a planted far-future lock raises TaskLocked once its
    per-call lock_wait (2 s) is over, instead of waiting for a lease that never ends."""
    workers(concurrency=1)
    sku = f"planted-{uuid.uuid4().hex[:6]}"
    key = proj.buy.lock_key(sku, 1)
    data.set(key, f"{_now_ms(data) + 10**9}:0:tok:5:{{}}")
    result = proj.buy.apply_async((sku, 1), lock_wait=2)
    with pytest.raises(TaskLocked):
        # its own 2 s, not the default 60 s nor the planted lease: a wait of either would
        # end this get (45 s, generous for a busy machine) with a timeout, not TaskLocked
        result.get(timeout=45)
    assert data.exists(key)
