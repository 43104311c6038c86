"""Retries the lock layer asks for (busy lock, unreachable lock Redis) never lose a message
nor leave it in RETRY, and the automatic countdown does not wait out a renewed lease."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import redis

from celery_singleton_lock import RedisLock
from celery_singleton_lock.config import clear_settings
from celery_singleton_lock.testing import RedisServer
from tests.worker.conftest import wait_for

pytestmark = pytest.mark.slow


@contextlib.contextmanager
def lock_url(proj: ModuleType, url: str) -> Iterator[None]:
    """Point this (producer) process's locks at ``url`` for the block."""
    proj.app.conf.singleton_lock_url = url
    clear_settings(proj.app)
    try:
        yield
    finally:
        proj.app.conf.singleton_lock_url = None
        clear_settings(proj.app)


def test_queue_scope_retry_is_published_even_when_the_key_is_taken(
    proj: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """Queue scope + retry: the message's queued lease lapsed and someone else took the
    key; the run retries, and the retry is published (not swallowed by the queue lock) and
    runs once the key is free."""
    workers(concurrency=1)
    key = proj.queued_retry.lock_key("qr")
    result = proj.queued_retry.apply_async(("qr",), countdown=2.5)
    time.sleep(1.5)  # its 1 s queued lease is over
    other = RedisLock(redis.Redis.from_url(proj.app.conf.broker_url), key, timeout=30)
    assert other.acquire(blocking=False)
    time.sleep(2.5)  # the run found the key taken and retried
    assert data.llen("events:qr") == 0
    other.release()
    assert result.get(timeout=30) == "ran"
    assert data.llen("events:qr") == 2  # one start, one end: it ran once


@pytest.mark.parametrize("outage", ["restart", "stall"])
def test_queue_scope_message_survives_a_lock_redis_outage(
    proj: ModuleType, data: redis.Redis, workers: Any, outage: str
) -> None:
    """Fail closed loses nothing: the lock Redis goes away (restarted empty, or stalled)
    between publish and run; the task retries until it is back and then runs exactly once,
    however many retries that takes."""
    server = RedisServer().start()
    port = server.port
    try:
        workers(concurrency=1, extra_env={"CSL_LOCK_URL": server.url})
        with lock_url(proj, server.url):
            result = proj.queued.apply_async(("outage", 0.2), countdown=1)
        assert server.pid is not None
        if outage == "restart":
            server.stop()
        else:
            os.kill(server.pid, signal.SIGSTOP)
        time.sleep(12)  # several failed attempts (more than the default max_retries=3)
        assert data.llen("events:outage") == 0  # never ran unlocked
        if outage == "restart":
            server = RedisServer(port=port).start()
        else:
            os.kill(server.pid, signal.SIGCONT)
        assert result.get(timeout=60) == "ran"
        assert data.llen("events:outage") == 2  # exactly once
    finally:
        with contextlib.suppress(ProcessLookupError, TypeError):
            os.kill(server.pid, signal.SIGCONT)  # type: ignore[arg-type]
        server.stop()


def test_automatic_retry_countdown_does_not_wait_out_the_lease(
    proj: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """Retry policy without lock_retry_delay: a duplicate of a 1.5 s run under a renewed
    30 s lease comes back within seconds (back-off), not after the 30 s lease."""
    workers(concurrency=2)
    first = proj.retry_auto.delay("ra", 1.5)
    assert wait_for(lambda: data.llen("events:ra") >= 1, timeout=20)
    duplicate = proj.retry_auto.delay("ra", 0.1)
    assert first.get(timeout=20) == "ran"
    assert duplicate.get(timeout=15) == "ran"
    assert data.get("overlaps:ra") is None


def test_run_scope_retry_is_not_skipped_as_a_duplicate(
    proj: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """Run scope + skip: between a task's self.retry() and its next attempt another run of
    the same work takes the lock; the retried attempt is the work itself, so it comes back
    after that run instead of being skipped (and never overlaps it)."""
    workers(concurrency=2)
    retried = proj.retry_hold.delay("rh", 0)
    assert wait_for(lambda: data.get("attempts:rh") == "1", timeout=20)
    # The first attempt frees the key as it ends (after publishing its retry): the other
    # run takes it then.
    key = proj.retry_hold.lock_key("rh", 0)
    assert wait_for(lambda: not data.exists(key), timeout=30)
    other = proj.retry_hold.delay("rh", 3.0)
    assert other.get(timeout=30) == "held"
    assert retried.get(timeout=30) == "attempt 2"
    assert data.get("overlaps:rh") is None


def test_the_locks_own_retries_leave_the_tasks_budget_alone(
    proj: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """Issue 22.1: autoretry_for=(ValueError,), max_retries=2, and a lock Redis outage of
    several seconds before the first attempt: the outage retries do not count, so the body
    still gets its three attempts (it used to fail after one), request.retries counts only
    the task's own retries, and a later message gets its full budget too."""
    server = RedisServer().start()
    port = server.port
    try:
        workers(concurrency=1, extra_env={"CSL_LOCK_URL": server.url})
        server.stop()
        first = proj.autoretried.delay("budget")
        time.sleep(7)  # outage retries, about every 5 s
        assert data.get("attempts:budget") is None  # never ran unlocked
        server = RedisServer(port=port).start()
        assert first.get(timeout=60) == "attempt 3"
        assert data.lrange("retries:budget", 0, -1) == ["0", "1", "2"]
        assert proj.autoretried.delay("budget-2").get(timeout=60) == "attempt 3"
    finally:
        server.stop()
