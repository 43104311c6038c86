"""Eventual fairness (``RedisLock(fair_after=...)``) on a real redis-server: a release lets
a newcomer barge in while the first waiter is young, hands the lock straight to it once it
has waited ``fair_after``, never lets two hold at once, and bounds how long a waiter can
be passed over."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from celery_singleton_lock import RedisLock
from celery_singleton_lock.engine.keyspace import QUEUE, companion_key
from celery_singleton_lock.engine.value import parse_value


def _queued(client: redis.Redis, key: str, fair_after: float | None) -> tuple[RedisLock, ...]:
    """A holder, and a waiter blocked behind it (queued), each on its own instance."""
    holder = RedisLock(client, key, timeout=10, fair_after=fair_after)
    waiter = RedisLock(client, key, timeout=10, fair_after=fair_after)
    assert holder.acquire(blocking=False)
    got: list[bool] = []
    thread = threading.Thread(target=lambda: got.append(waiter.acquire(timeout=10)))
    thread.start()
    deadline = time.monotonic() + 30
    while client.zcard(f"{{{key}}}:queue") == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    return holder, waiter, thread, got  # type: ignore[return-value]


def _plant_waiter(client: redis.Redis, key: str, waited: float) -> None:
    """A waiter queued ``waited`` seconds ago that is between two tries (not blocked now),
    as the queue, its waiter key and the flag in the lock value record it."""
    value = client.get(key)
    assert value is not None
    client.setrange(key, value.index(b":") + 1, "1")  # "a waiter saw it held"
    seconds, micros = client.time()
    first_try = seconds * 1_000_000 + micros - int(waited * 1_000_000)
    client.zadd(companion_key(key, QUEUE), {"planted": first_try})
    client.set(companion_key(key, "waiter:planted"), '10000:{"task_id": "planted"}', px=5000)


@pytest.mark.parametrize(
    ("fair_after", "waited", "barges"),
    [(5.0, 0.0, True), (0.2, 0.4, False), (None, 0.0, False)],
    ids=["young-waiter", "old-waiter", "fifo"],
)
def test_the_release_frees_or_hands_over_by_the_first_waiter_s_wait(
    client: redis.Redis, key: str, fair_after: float | None, waited: float, barges: bool
) -> None:
    """The first waiter queued ``waited`` s ago: under fair_after=5 s the release frees the
    lock and a newcomer takes it; under fair_after=0.2 s (it waited 0.4 s) and without
    fair_after the release hands it to that waiter, and the newcomer finds it held."""
    holder = RedisLock(client, key, timeout=10, fair_after=fair_after)
    assert holder.acquire(blocking=False)
    _plant_waiter(client, key, waited)
    holder.release()
    newcomer = RedisLock(client, key, timeout=10, fair_after=fair_after)
    assert newcomer.acquire(blocking=False) is barges
    if barges:
        newcomer.release()
    else:
        value = parse_value(client.get(key))
        assert value is not None
        assert value.token == "planted"


@pytest.mark.parametrize("fair_after", [None, 5.0])
def test_a_real_waiter_gets_the_lock_either_way(
    client: redis.Redis, key: str, fair_after: float | None
) -> None:
    """A blocked waiter gets the lock at the release: handed to it, or woken to take it."""
    holder, waiter, thread, got = _queued(client, key, fair_after)
    holder.release()
    thread.join(timeout=5)
    assert got == [True]
    waiter.release()


@pytest.mark.parametrize("fair_after", [None, 0.2])
def test_a_greedy_newcomer_cannot_pass_a_waiter_for_ever(
    client: redis.Redis, key: str, fair_after: float | None
) -> None:
    """Three greedy clients each hold 50 ms, release and try again every millisecond. A
    waiter that queues behind them gets the lock: at the first release without fair_after,
    once it has waited 0.2 s with it.

    Judged by order on the server's clock, not by how long the waiter took: no greedy take
    (its fencing token: the server's microseconds at the take) may come later than the
    waiter's arrival in the queue (its place's score, seen while it waits) plus fair_after
    (and 1 ms), before the waiter's own take."""
    waiter = RedisLock(client, key, timeout=10, fair_after=fair_after, token="fair-waiter")
    queue = companion_key(key, QUEUE)
    done = threading.Event()
    takes: list[int] = []
    arrived: list[float] = []

    def hog() -> None:
        greedy = RedisLock(client, key, timeout=10, fair_after=fair_after)
        deadline = time.monotonic() + 60
        while not done.is_set() and time.monotonic() < deadline:
            if greedy.acquire(blocking=False):
                takes.append(greedy.fencing_token or 0)
                time.sleep(0.05)
                greedy.release()
            else:
                time.sleep(0.001)

    def watch() -> None:  # the waiter's arrival, as the queue records it
        while not done.is_set() and not arrived:
            score = client.zscore(queue, "fair-waiter")
            if score is not None:
                arrived.append(score)
            time.sleep(0.001)

    hogs = [threading.Thread(target=hog) for _ in range(3)]
    watcher = threading.Thread(target=watch)
    for thread in hogs:
        thread.start()
    time.sleep(0.2)
    watcher.start()
    try:
        acquired = waiter.acquire(timeout=30)
        mine = waiter.fencing_token
        if acquired:
            waiter.release()
    finally:
        done.set()
        for thread in (*hogs, watcher):
            thread.join(timeout=10)
    assert acquired
    assert mine is not None
    if arrived:  # (seen on any but the most starved machine; nothing to judge otherwise)
        due = arrived[0] + (fair_after or 0.0) * 1_000_000 + 1_000
        passed = [fence for fence in takes if due <= fence < mine]
        assert passed == [], f"greedy takes passed the waiter: {passed}"


def test_exclusion_holds_with_fair_after(client: redis.Redis, key: str) -> None:
    """Eight threads with fair_after=5 ms, 40 critical sections each: never two inside, no
    lost update of a counter kept in Redis."""
    inside = [0]
    overlaps = [0]
    counter = f"{key}:counter"

    def work() -> None:
        lock = RedisLock(client, key, timeout=10, fair_after=0.005)
        for _ in range(40):
            assert lock.acquire(timeout=30)
            inside[0] += 1
            if inside[0] > 1:
                overlaps[0] += 1
            value = int(client.get(counter) or 0)
            client.set(counter, value + 1)
            inside[0] -= 1
            lock.release()

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert overlaps == [0]
    assert int(client.get(counter) or 0) == 320


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "1", True])
def test_fair_after_is_checked(client: redis.Redis, key: str, bad: object) -> None:
    with pytest.raises(ValueError, match="fair_after"):
        RedisLock(client, key, fair_after=bad)  # type: ignore[arg-type]


def test_fair_after_needs_scripting(client: redis.Redis, key: str) -> None:
    with pytest.raises(ValueError, match="fair_after needs scripting"):
        RedisLock(client, key, scripting=False, fair_after=0.01)
