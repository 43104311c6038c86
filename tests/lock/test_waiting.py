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
from celery_singleton_lock.engine.value import parse_value
from celery_singleton_lock.engine.wire import socket_timeout
from celery_singleton_lock.testing import RedisServer


def _total_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k not in ("cmdstat_info",))


def test_release_wakes_a_waiter_long_before_its_fallback_poll(make_lock: Any) -> None:
    """A blocked waiter gets the lock after the release, though neither its fallback poll
    (60 s) nor the holder's lease (120 s) comes within its acquire timeout (45 s): only the
    release's wake-up can let it in (tens of ms on a quiet machine). No bound on elapsed
    time: the construction is the bound."""
    holder = make_lock(timeout=120)
    waiter = make_lock(timeout=30, fallback_poll=60.0)
    assert holder.acquire()
    got: list[bool] = []
    thread = threading.Thread(target=lambda: got.append(waiter.acquire(timeout=45)))
    thread.start()
    time.sleep(0.3)  # the waiter is (most likely) blocked by now
    holder.release()
    thread.join(timeout=60)
    assert got == [True]
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
    assert elapsed >= 3.0 - 0.01  # it waited its timeout (a late return is load, not a fault)
    # at most about 25 per fallback period begun: counted against the periods the wait
    # really lasted, so a slow machine stretching the wait is no failure
    assert used <= 25 * (int(elapsed / 1.0) + 1), (used, elapsed)


def test_acquire_timeout_is_respected(make_lock: Any) -> None:
    """acquire(timeout=t) behind a live holder returns False after t seconds, not sooner,
    and not at its next fallback poll (60 s): the upper bound leaves 15 s for a busy
    machine, far below what sleeping on to the poll would take."""
    holder = make_lock(timeout=120)
    assert holder.acquire()
    for wanted in (0.05, 0.4):
        started = time.monotonic()
        assert not make_lock(fallback_poll=60.0).acquire(timeout=wanted)
        assert wanted - 0.01 < time.monotonic() - started < wanted + 15


def _hold_forever(url: str, name: str, scripting: bool, ready: Any) -> None:
    client = redis.Redis.from_url(url)
    lock = RedisLock(client, name, timeout=1.0, scripting=scripting)
    lock.acquire()
    # the key itself stays a minute (its lease, in the value, still ends in 1 s): a waiter
    # can only get in by taking over the ended lease, never because Redis expired the key
    client.pexpire(name, 60_000)
    ready.set()
    time.sleep(60)


def test_sigkilled_holder_is_succeeded_within_lease_plus_one_poll(
    redis_server: RedisServer, make_lock: Any, client: redis.Redis, key: str, scripting: bool
) -> None:
    """A holder process killed with SIGKILL is succeeded once its 1 s lease runs out (its
    key kept: the waiter takes over the ended lease), within one fallback period (and in
    practice within a few ms). Judged on the server's clock: the take-over comes after the
    lease end, and before one poll and a generous 10 s for a busy machine."""
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    proc = ctx.Process(target=_hold_forever, args=(redis_server.url, key, scripting, ready))
    proc.start()
    try:
        assert ready.wait(30)
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGKILL)
        dead = parse_value(client.get(key)).expiry_ms
        assert dead is not None
        waiter = make_lock(timeout=5, fallback_poll=1.0)
        assert waiter.acquire(timeout=30)
        seconds, micros = client.time()
        now = int(seconds) * 1000 + int(micros) // 1000
        assert dead <= now < dead + 1000 + 10_000  # after the lease, within a poll (+ slack)
        assert waiter.owned()
    finally:
        proc.kill()
        proc.join(timeout=5)


def test_auto_renew_holds_past_several_leases(make_lock: Any) -> None:
    """With auto_renew a 1.5 s lease is held for 4 s; rivals fail throughout. (The renewer
    renews every 0.5 s: only a process starved of the CPU for a second could lose it.)"""
    holder = make_lock(timeout=1.5, auto_renew=True)
    rival = make_lock()
    assert holder.acquire()
    deadline = time.monotonic() + 4.0
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
    deadline = time.monotonic() + 30
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


def test_a_client_from_a_bare_url_keeps_redis_pys_own_socket_timeout(
    redis_server: RedisServer, key: str, scripting: bool
) -> None:
    """``Redis.from_url(url)`` with no timeout in it: its connections still have redis-py's
    default (5 s from redis-py 8, none before), which the pool leaves out of its options. A
    waiter with a 60 s fallback poll blocks for less than that, so it waits past the socket
    timeout without a LockBackendError (it used to block 5 s on a 5 s socket), and a
    release still wakes it."""
    client = redis.Redis.from_url(redis_server.url)
    default = client.connection_pool.make_connection().socket_timeout  # not connected
    assert socket_timeout(client) == (float(default) if default else None)
    holder = RedisLock(client, key, timeout=30, scripting=scripting)
    waiter = RedisLock(client, key, timeout=30, scripting=scripting, fallback_poll=60.0)
    assert holder.acquire()
    bound = (float(default) if default else 1.0) + 1.5
    assert not waiter.acquire(timeout=bound)  # blocked past the socket timeout: no error
    _released_wakes(client, holder, waiter)


def test_fallback_poll_longer_than_the_socket_timeout(
    redis_server: RedisServer, key: str, scripting: bool
) -> None:
    """A waiter whose fallback poll (60 s) is longer than its client's socket timeout (3 s)
    waits its full acquire timeout (4 s) without a LockBackendError, and a release still
    wakes it. (A host running two copies of the suite has taken over a second to answer a
    plain GET.)"""
    client = redis.Redis.from_url(redis_server.url, socket_timeout=3.0)
    holder = RedisLock(client, key, timeout=30, scripting=scripting)
    waiter = RedisLock(client, key, timeout=30, scripting=scripting, fallback_poll=60.0)
    assert holder.acquire()
    started = time.monotonic()
    assert not waiter.acquire(timeout=4.0)
    # not sooner than its timeout; the upper bound only tells "not the 60 s poll" and
    # leaves 15 s for a busy machine
    assert 4.0 - 0.01 < time.monotonic() - started < 4.0 + 15
    _released_wakes(client, holder, waiter)


def _released_wakes(client: redis.Redis, holder: RedisLock, waiter: RedisLock) -> None:
    """A release 0.5 s into the waiter's next wait lets it in; then close ``client``."""
    releaser = threading.Timer(0.5, holder.release)
    releaser.start()
    assert waiter.acquire(timeout=30)
    waiter.release()
    # The hand-off can wake the waiter before the releasing thread has read its reply.
    releaser.join(5)
    client.close()
