"""A lock with N slots (``limit=N``): at most N holders at once, each an ordinary leased,
owner-checked hold with a fencing token larger than every earlier one of that lock."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from typing import Any

import pytest
import redis

from celery_singleton_lock import LockNotOwned, RedisLock
from celery_singleton_lock.testing import RedisServer
from tests.lock.conftest import wait_queued


def slots(client: redis.Redis, key: str, limit: int = 3, **kwargs: Any) -> RedisLock:
    kwargs.setdefault("timeout", 10)
    return RedisLock(client, key, limit=limit, **kwargs)


def test_at_most_limit_holders_and_a_release_lets_the_next_in(
    client: redis.Redis, key: str
) -> None:
    """Three holders take the three slots, a fourth is refused; when one releases, the
    fourth gets that slot; holders() lists them all."""
    holders = [slots(client, key) for _ in range(3)]
    assert all(lock.acquire(blocking=False) for lock in holders)
    fourth = slots(client, key)
    assert not fourth.acquire(blocking=False)
    assert len(fourth.holders()) == 3
    assert fourth.locked()
    holders[1].release()
    assert fourth.acquire(blocking=False)
    assert fourth.owned()
    assert not holders[1].owned()
    for lock in (holders[0], holders[2], fourth):
        lock.release()
    assert not fourth.locked()


def test_twelve_threads_never_exceed_three_inside(client: redis.Redis, key: str) -> None:
    """Twelve threads, 25 rounds each, on a three-slot lock: never more than three inside
    at once (an overlap counter would show a fourth), every slot is used, and fencing
    tokens grow in the order the holds began."""
    inside = 0
    most = 0
    guard = threading.Lock()
    started: list[tuple[float, int]] = []
    used_keys: set[str] = set()

    def work() -> None:
        nonlocal inside, most
        lock = slots(client, key, fallback_poll=0.2)
        for _ in range(25):
            assert lock.acquire(timeout=30)
            with guard:
                inside += 1
                most = max(most, inside)
                started.append((time.monotonic(), lock.fencing_token or 0))
                used_keys.add(lock._hold().key)  # type: ignore[union-attr]
            time.sleep(0.001)
            with guard:
                inside -= 1
            lock.release()

    threads = [threading.Thread(target=work) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    assert most <= 3
    assert most == 3  # the slots were really used side by side
    assert len(started) == 300
    assert len(used_keys) == 3
    fences = [fence for _, fence in sorted(started)]
    assert len(set(fences)) == 300


def test_fencing_tokens_grow_across_slots(client: redis.Redis, key: str) -> None:
    """Holds taken one after another on different slots get ever larger fencing tokens,
    also when a slot is taken over after its lease expired."""
    tokens = []
    keep = [slots(client, key, timeout=30) for _ in range(2)]
    for lock in keep:
        assert lock.acquire(blocking=False)
        tokens.append(lock.fencing_token)
    short = slots(client, key, timeout=0.2)
    assert short.acquire(blocking=False)
    tokens.append(short.fencing_token)
    time.sleep(0.3)
    thief = slots(client, key)
    assert thief.acquire(blocking=False)  # the expired third slot
    tokens.append(thief.fencing_token)
    keep[0].release()
    again = slots(client, key)
    assert again.acquire(blocking=False)
    tokens.append(again.fencing_token)
    assert tokens == sorted(tokens)
    assert len(set(tokens)) == len(tokens)
    with pytest.raises(LockNotOwned):
        short.release()


def test_waiters_get_slots_in_the_order_they_came(client: redis.Redis, key: str) -> None:
    """With both slots held, five waiters queue one after another; as slots free up they
    are handed over in arrival order."""
    holders = [slots(client, key, limit=2, timeout=30) for _ in range(2)]
    assert all(lock.acquire(blocking=False) for lock in holders)
    order: list[int] = []
    done = threading.Event()

    def wait(index: int) -> None:
        lock = slots(client, key, limit=2, timeout=30, fallback_poll=5.0)
        assert lock.acquire(timeout=120)
        order.append(index)
        time.sleep(0.05)
        lock.release()
        if len(order) == 5:
            done.set()

    threads = []
    for index in range(5):
        thread = threading.Thread(target=wait, args=(index,))
        thread.start()
        threads.append(thread)
        # The next one comes only after this one has queued (however slow the machine).
        wait_queued(client, key, index + 1)
    holders[0].release()
    assert done.wait(120)
    for thread in threads:
        thread.join(10)
    assert order == [0, 1, 2, 3, 4]
    holders[1].release()


def test_a_group_never_holds_two_slots(client: redis.Redis, key: str) -> None:
    """Holders of one group (e.g. two deliveries of one task) take one slot between them:
    the second is refused while slots are free for everyone else."""
    first = slots(client, key, group="task-7-")
    second = slots(client, key, group="task-7-")
    other = slots(client, key, group="task-8-")
    assert first.acquire(blocking=False)
    assert not second.acquire(blocking=False)
    assert not second.acquire(timeout=0.3)
    assert other.acquire(blocking=False)
    first.release()
    assert second.acquire(blocking=False)
    second.release()
    other.release()


def _hold_a_slot(url: str, key: str, ready: Any) -> None:
    RedisLock(redis.Redis.from_url(url), key, timeout=1.0, limit=2).acquire()
    ready.set()
    time.sleep(60)


def test_a_killed_holders_slot_frees_within_its_lease(
    redis_server: RedisServer, client: redis.Redis, key: str
) -> None:
    """Both slots of a two-slot lock held, one holder SIGKILLed: a waiter gets its slot
    about one lease (1 s) later, not never."""
    keeper = slots(client, key, limit=2, timeout=30)
    assert keeper.acquire(blocking=False)
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    proc = ctx.Process(target=_hold_a_slot, args=(redis_server.url, key, ready))
    proc.start()
    try:
        assert ready.wait(10)
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGKILL)
        waiter = slots(client, key, limit=2, fallback_poll=1.0)
        assert waiter.acquire(timeout=30)  # bounded generously: the lease is 1 s
        waiter.release()
    finally:
        proc.kill()
        proc.join(5)
        keeper.release()


def test_bad_limits_are_refused(client: redis.Redis, key: str) -> None:
    """limit must be an int >= 1, and slots need scripting mode."""
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="limit"):
            RedisLock(client, key, limit=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="scripting"):
        RedisLock(client, key, limit=2, scripting=False)
