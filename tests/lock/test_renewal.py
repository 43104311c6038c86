"""Lease renewal at scale and under a stalled server: renewals run in one lane per
connection pool, and a lane's cost per hold does not grow with how many are held."""

from __future__ import annotations

import os
import signal
import time

import pytest
import redis

from celery_singleton_lock import RedisLock
from celery_singleton_lock.engine.renewal import _Renewer, renewer
from celery_singleton_lock.testing import RedisServer

#: How long the 10,000-lock test holds its locks (seconds); raise it to soak longer.
HOLD_SECONDS = float(os.environ.get("CSL_RENEW_HOLD_SECONDS", "12"))


def test_a_stalled_server_does_not_starve_renewals_on_another() -> None:
    """With server A stopped (SIGSTOP) while its client waits up to 10 s per call, five
    auto-renewed 2 s leases on server B stay held for 3 s: A's stuck renewal never delays
    B's. (2 s, renewed every 0.67 s: only a process starved for over a second could lose
    one on its own.)"""
    with RedisServer() as server_a, RedisServer() as server_b:
        stalled = redis.Redis.from_url(server_a.url, socket_timeout=10)
        healthy = redis.Redis.from_url(server_b.url, socket_timeout=10)
        on_a = RedisLock(stalled, "lane:a", timeout=1.0, auto_renew=True)
        on_b = [RedisLock(healthy, f"lane:b{n}", timeout=2.0, auto_renew=True) for n in range(5)]
        assert on_a.acquire(blocking=False)
        assert all(lock.acquire(blocking=False) for lock in on_b)
        assert server_a.pid is not None
        os.kill(server_a.pid, signal.SIGSTOP)
        try:
            time.sleep(3.0)
            assert not any(lock.lease_lost for lock in on_b)
            assert all(lock.owned() for lock in on_b)
            assert on_a.lease_lost  # by the clock, while its renewal still hangs
        finally:
            os.kill(server_a.pid, signal.SIGCONT)
        for lock in on_b:
            lock.release()
        stalled.close()
        healthy.close()


@pytest.mark.alone
def test_ten_thousand_auto_renewed_locks_keep_their_leases() -> None:
    """10,000 auto-renewed 3 s leases held in one process for several leases: every one is
    still owned at the end, none reported lost, in one renewer lane for the one pool."""
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url, socket_timeout=10)
        locks = [
            RedisLock(client, f"many:{n}", timeout=3.0, auto_renew=True) for n in range(10_000)
        ]
        for lock in locks:
            assert lock.acquire(blocking=False)
        assert renewer.lanes() >= 1
        deadline = time.monotonic() + HOLD_SECONDS
        while time.monotonic() < deadline:
            time.sleep(0.5)
            assert not any(lock.lease_lost for lock in locks[::97])
        assert not any(lock.lease_lost for lock in locks)
        now_ms = int(client.time()[0]) * 1000
        values = client.mget([lock.name for lock in locks])
        for lock, value in zip(locks, values, strict=True):
            assert value is not None
            expiry, _, token = value.decode().split(":")[:3]
            assert token == lock.token
            assert int(expiry) > now_ms
        for lock in locks:
            lock.release()
        client.close()


def test_renewals_due_together_go_in_one_batch_and_each_hold_gets_its_own_answer() -> None:
    """Fifty 1.5 s leases of one client are renewed together (one pipelined round trip per
    batch): after SCRIPT FLUSH the batch reloads its script and goes on, and a key deleted
    under its holder makes that one hold lost while the other 49 stay owned. The test waits
    for four batches' worth of renewals (bounded: 30 s), not a fixed time."""
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url, socket_timeout=5)
        locks = [RedisLock(client, f"batch:{n}", timeout=1.5, auto_renew=True) for n in range(50)]
        for lock in locks:
            assert lock.acquire(blocking=False)
        client.script_flush()
        client.delete(locks[7].name)
        calls_before = _evalsha_calls(client)
        deadline = time.monotonic() + 30
        while not (locks[7].lease_lost and _evalsha_calls(client) - calls_before >= 49 * 4):
            assert time.monotonic() < deadline, "fewer than four batches of renewals"
            time.sleep(0.05)
        assert locks[7].lease_lost
        others = locks[:7] + locks[8:]
        assert not any(lock.lease_lost for lock in others)
        assert all(lock.owned() for lock in others)
        assert _evalsha_calls(client) - calls_before >= 49 * 4  # they really were renewed
        for lock in others:
            lock.release()
        client.close()


def _evalsha_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0))


def test_registering_a_hold_does_not_wake_an_idle_lane() -> None:
    """Short runs end long before their first renewal is due. Once the lane's thread has
    dropped such an ended hold and gone idle, registering the next hold must not wake it
    (a wake-up per task is a thread switch per task): an idle thread wakes on its own at
    least as often as the shortest renewal delay it serves."""

    class Held:
        ended = False

    class Lock:  # a lane keeps only a weak reference; nothing here is renewed
        pass

    lanes = _Renewer()
    lock = Lock()
    first = Held()
    lanes.schedule("pool", lock, first, 10.0)
    lane = lanes._lanes["pool"]
    first.ended = True
    with lane._cond:  # the thread drops the ended hold as soon as it looks
        lane._cond.notify()
    deadline = time.monotonic() + 30
    while True:
        with lane._cond:
            if not lane._heap and lane._sleeping_until != float("-inf"):
                break
        assert time.monotonic() < deadline, "the lane never dropped the ended hold"
        time.sleep(0.01)
    wakes = 0
    notify = lane._cond.notify

    def counted(n: int = 1) -> None:
        nonlocal wakes
        wakes += 1
        notify(n)

    lane._cond.notify = counted  # type: ignore[method-assign]
    for _ in range(200):
        hold = Held()
        lanes.schedule("pool", lock, hold, 10.0)
        hold.ended = True
    assert wakes == 0
