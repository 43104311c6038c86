"""Direct hand-off: a release gives the lock straight to the first waiter in line, in the
order the waiters came, never to a waiter that gave up or died, and the waiter owns it
without another round trip."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from typing import Any

import redis

from celery_singleton_lock import RedisLock
from celery_singleton_lock.engine.keyspace import companion_key
from celery_singleton_lock.testing import RedisServer
from tests.lock.conftest import wait_queued


def _count_calls(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(row["calls"]) for name, row in stats.items()}


def test_waiters_get_the_lock_in_the_order_they_came(
    make_lock: Any, scripting: bool, client: redis.Redis, key: str
) -> None:
    """Five threads queue one after another behind a holder; each takes the lock, notes its
    turn and releases: with scripts they get it exactly in arrival order; in plain mode
    (releases wake, they do not hand over) every one of them still gets it."""
    holder = make_lock(timeout=30)
    assert holder.acquire()
    order: list[int] = []

    def wait(index: int) -> None:
        lock = make_lock(timeout=30, fallback_poll=5.0)
        assert lock.acquire(timeout=20)
        order.append(index)
        lock.release()

    threads = []
    for index in range(5):
        thread = threading.Thread(target=wait, args=(index,))
        thread.start()
        threads.append(thread)
        wait_queued(client, key, index + 1)  # each is queued before the next one comes
    holder.release()
    for thread in threads:
        thread.join(30)
    if scripting:
        assert order == [0, 1, 2, 3, 4]
    else:
        assert sorted(order) == [0, 1, 2, 3, 4]


def test_the_waiter_owns_the_lock_without_another_try(fresh_server: RedisServer) -> None:
    """After the holder's release, a blocked waiter owns the lock (bigger fencing token, the
    server agrees) with no acquire script run after the release: the release handed it
    over and the waiter's blocking pop brought the grant."""
    client = redis.Redis.from_url(fresh_server.url)
    holder = RedisLock(client, "handoff", timeout=30)
    waiter = RedisLock(client, "handoff", timeout=30, fallback_poll=10.0)
    assert holder.acquire()
    holder.release()  # the scripts are loaded now: no NOSCRIPT retry below
    assert holder.acquire()
    first = holder.fencing_token
    got = threading.Event()
    threading.Thread(target=lambda: (waiter.acquire(timeout=20), got.set())).start()
    wait_queued(client, "handoff", 1)  # the waiter ran its try and is blocked
    before = _count_calls(client)
    holder.release()
    assert got.wait(10)
    after = _count_calls(client)
    assert waiter.owned()
    assert waiter.fencing_token is not None
    assert first is not None
    assert waiter.fencing_token > first
    scripts = after.get("evalsha", 0) - before.get("evalsha", 0)
    assert scripts == 1, (before, after)  # the release only
    waiter.release()
    assert not waiter.locked()


def test_a_waiter_that_gave_up_is_never_handed_the_lock(make_lock: Any) -> None:
    """A waiter whose acquire timed out left the queue: the holder's release then frees the
    lock for whoever comes next instead of handing it to the departed waiter."""
    holder = make_lock(timeout=30)
    assert holder.acquire()
    quitter = make_lock(timeout=30, fallback_poll=5.0)
    assert not quitter.acquire(timeout=0.4)
    holder.release()
    assert not holder.locked()
    newcomer = make_lock(timeout=30)
    assert newcomer.acquire(blocking=False)
    newcomer.release()


def _queue_and_hang(url: str, name: str, scripting: bool, queued: Any) -> None:
    """Queue behind the holder, then hang in the wait until killed."""
    client = redis.Redis.from_url(url)
    threading.Timer(0.3, queued.set).start()
    RedisLock(client, name, timeout=30, scripting=scripting, fallback_poll=0.3).acquire()


def test_a_dead_waiter_is_skipped_once_its_place_lapsed(
    redis_server: RedisServer, make_lock: Any, client: redis.Redis, key: str, scripting: bool
) -> None:
    """A queued waiter is SIGKILLed; once its place lapsed (it blocks 0.3 s at a time, plus
    0.5 s slack), the holder's release goes to a live waiter queued behind it."""
    holder = make_lock(timeout=30)
    assert holder.acquire()
    ctx = multiprocessing.get_context("fork")
    queued = ctx.Event()
    ghost = ctx.Process(target=_queue_and_hang, args=(redis_server.url, key, scripting, queued))
    ghost.start()
    try:
        assert queued.wait(30)
        # killed only once it is really queued (not merely 0.3 s after it started)
        deadline = time.monotonic() + 30
        while client.zcard(companion_key(key, "queue")) < 1:
            assert time.monotonic() < deadline, "the ghost never queued"
            time.sleep(0.02)
        assert ghost.pid is not None
        os.kill(ghost.pid, signal.SIGKILL)
        ghost.join(5)
        # its poll (60 s) and a grant to the ghost (its 30 s lease) both lie beyond its 20 s
        # timeout: only a hand-over or wake-up at the release can let it in
        live = make_lock(timeout=30, fallback_poll=60.0)
        got: list[bool] = []
        thread = threading.Thread(target=lambda: got.append(live.acquire(timeout=20)))
        thread.start()
        time.sleep(1.0)  # the dead waiter's place lapses (server time passes as this does)
        holder.release()
        thread.join(30)
        assert got == [True]
        assert live.owned()
        live.release()
    finally:
        ghost.kill()
        ghost.join(5)


def test_a_grant_that_races_the_timeout_is_kept(fresh_server: RedisServer) -> None:
    """When the release hands the lock over just as the waiter's acquire timeout ends, the
    waiter's acquire returns True and it holds the lock (it is never left held by nobody)."""
    client = redis.Redis.from_url(fresh_server.url)
    for _ in range(20):
        holder = RedisLock(client, "race", timeout=30)
        waiter = RedisLock(client, "race", timeout=30, fallback_poll=5.0)
        assert holder.acquire()
        release = threading.Timer(0.2, holder.release)
        release.start()
        if waiter.acquire(timeout=0.2):
            assert waiter.owned()
            waiter.release()
        release.join(10)  # on a loaded machine the timer may fire after the waiter gave up
        assert not holder.locked()  # never left held by a waiter that gave up
