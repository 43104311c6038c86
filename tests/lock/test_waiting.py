"""Waiting: woken by the release, bounded commands while waiting, crashed holders noticed."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from typing import Any

import redis

from celery_singleton_lock import RedisLock
from celery_singleton_lock.testing import RedisServer


def _total_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k not in ("cmdstat_info",))


def test_release_wakes_a_waiter_long_before_its_fallback_poll(make_lock: Any) -> None:
    """A blocked waiter gets the lock well within its 5 s fallback poll of the release, so
    the release notified it (tens of ms on a quiet machine; the bound allows a loaded one)."""
    holder = make_lock(timeout=30)
    waiter = make_lock(timeout=30, fallback_poll=5.0)
    assert holder.acquire()
    got: dict[str, float] = {}

    def wait() -> None:
        if waiter.acquire(timeout=10):
            got["at"] = time.perf_counter()

    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(0.3)  # the waiter is now blocked
    released = time.perf_counter()
    holder.release()
    thread.join(timeout=10)
    assert "at" in got
    assert got["at"] - released < 0.5
    waiter.release()


def test_commands_during_a_three_second_wait_stay_bounded(
    fresh_server: RedisServer, scripting: bool
) -> None:
    """A waiter blocked 3 s behind a live holder sends a bounded number of commands per
    fallback period (1 s: one try that renews its place in the queue, about ten commands
    counted inside the script, and one blocking pop), not one per millisecond like a
    sleep-and-retry loop."""
    client = redis.Redis.from_url(fresh_server.url)
    holder = RedisLock(client, "busy", timeout=60, scripting=scripting)
    waiter = RedisLock(client, "busy", timeout=60, scripting=scripting, fallback_poll=1.0)
    assert holder.acquire()
    before = _total_calls(client)
    started = time.monotonic()
    assert not waiter.acquire(timeout=3)
    elapsed = time.monotonic() - started
    used = _total_calls(client) - before - 1  # minus our own INFO
    assert 2.9 < elapsed < 3.5
    assert used <= 25 * 3, used


def test_acquire_timeout_is_respected(make_lock: Any) -> None:
    """acquire(timeout=t) behind a live holder returns False after about t seconds."""
    holder = make_lock(timeout=30)
    assert holder.acquire()
    for wanted in (0.05, 0.4):
        started = time.monotonic()
        assert not make_lock().acquire(timeout=wanted)
        assert wanted - 0.01 < time.monotonic() - started < wanted + 0.15


def _hold_forever(url: str, name: str, scripting: bool, ready: Any) -> None:
    client = redis.Redis.from_url(url)
    lock = RedisLock(client, name, timeout=1.0, scripting=scripting)
    lock.acquire()
    ready.set()
    time.sleep(60)


def test_sigkilled_holder_is_succeeded_within_lease_plus_one_poll(
    redis_server: RedisServer, make_lock: Any, key: str, scripting: bool
) -> None:
    """A holder process killed with SIGKILL is succeeded once its 1 s lease runs out,
    within one fallback period (and in practice within a few ms)."""
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    proc = ctx.Process(target=_hold_forever, args=(redis_server.url, key, scripting, ready))
    proc.start()
    try:
        assert ready.wait(10)
        killed = time.monotonic()
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGKILL)
        waiter = make_lock(timeout=5, fallback_poll=1.0)
        assert waiter.acquire(timeout=5)
        took = time.monotonic() - killed
        assert took < 1.0 + 1.0
        assert waiter.owned()
    finally:
        proc.kill()
        proc.join(timeout=5)


def test_auto_renew_holds_past_several_leases(make_lock: Any) -> None:
    """With auto_renew a 0.5 s lease is held for 2.5 s; rivals fail throughout."""
    holder = make_lock(timeout=0.5, auto_renew=True)
    rival = make_lock()
    assert holder.acquire()
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:
        assert not rival.acquire(blocking=False)
        time.sleep(0.1)
    assert holder.owned()
    assert not holder.lease_lost
    holder.release()
    time.sleep(0.3)  # a renewal after release would recreate the key
    assert not holder.locked()


def test_auto_renew_reports_a_lost_lease(make_lock: Any, client: redis.Redis, key: str) -> None:
    """When the key is taken away, the renewer sets lease_lost instead of dying silently."""
    holder = make_lock(timeout=0.6, auto_renew=True)
    assert holder.acquire()
    client.delete(key)
    deadline = time.monotonic() + 3
    while not holder.lease_lost and time.monotonic() < deadline:
        time.sleep(0.05)
    assert holder.lease_lost


def test_non_blocking_try_does_not_ask_for_a_wake_up(
    make_lock: Any, client: redis.Redis, key: str, scripting: bool
) -> None:
    """A failed acquire(blocking=False) leaves no waiter flag, so the release sends no
    wake-up; a blocking waiter does set it (scripted mode keeps that flag in the value)."""
    holder = make_lock(timeout=30)
    assert holder.acquire()
    assert not make_lock().acquire(blocking=False)
    if scripting:
        assert client.get(key).split(b":")[1] == b"0"
    holder.release()
    assert client.llen(holder.signal_key) == (0 if scripting else 1)
    assert holder.acquire()
    assert not make_lock().acquire(timeout=0.2)
    if scripting:
        assert client.get(key).split(b":")[1] == b"1"


def test_fallback_poll_longer_than_the_socket_timeout(
    redis_server: RedisServer, key: str, scripting: bool
) -> None:
    """A waiter whose fallback poll (5 s) is longer than its client's socket timeout (1 s)
    waits its full acquire timeout without a LockBackendError, and a release still wakes it.
    (With 0.3 s, a loaded CI host once took longer than that to answer a plain GET.)"""
    client = redis.Redis.from_url(redis_server.url, socket_timeout=1.0)
    holder = RedisLock(client, key, timeout=30, scripting=scripting)
    waiter = RedisLock(client, key, timeout=30, scripting=scripting, fallback_poll=5.0)
    assert holder.acquire()
    started = time.monotonic()
    assert not waiter.acquire(timeout=1.5)
    assert 1.4 < time.monotonic() - started < 2.5
    releaser = threading.Timer(0.5, holder.release)
    releaser.start()
    assert waiter.acquire(timeout=5)
    waiter.release()
    # The hand-off can wake the waiter before the releasing thread has read its reply.
    releaser.join(5)
    client.close()
