"""Lock Redis down: fail closed by default, fail open only when asked."""

from __future__ import annotations

import os
import signal
import time
from types import ModuleType
from typing import Any

import pytest
import redis

from celery_singleton_lock.client import DEFAULT_SOCKET_TIMEOUT, client_from_url
from celery_singleton_lock.engine.wire import socket_timeout
from celery_singleton_lock.testing import RedisServer, free_port
from tests.worker.conftest import wait_for

pytestmark = pytest.mark.slow


def test_lock_redis_stopped_mid_run_fails_closed(
    proj: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """With the lock Redis stopped during a run, the running body finishes, the worker
    survives, a new task does not run while the lock Redis is down, and it runs once the
    lock Redis is back."""
    lock_server = RedisServer().start()
    port = lock_server.port
    try:
        worker = workers(concurrency=2, extra_env={"CSL_LOCK_URL": lock_server.url})
        running = proj.renewing.delay("m1", 2.5)
        assert wait_for(lambda: data.llen("events:m1") >= 1, timeout=20)
        lock_server.stop()
        assert running.get(timeout=20) == "ran"
        waiting = proj.skippy.delay("down", 0.1)
        time.sleep(3.0)
        assert data.llen("events:down") == 0  # never ran unlocked
        assert worker.process.poll() is None
        lock_server = RedisServer(port=port).start()
        assert waiting.get(timeout=30) == "ran"
        assert data.llen("events:down") == 2
    finally:
        lock_server.stop()


def test_fail_open_runs_the_task_and_says_so(
    proj: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """With singleton_lock_fail_open=True and no lock Redis, the body runs and the worker
    logs a warning that it ran unlocked."""
    dead = f"redis://127.0.0.1:{free_port()}/0"
    worker = workers(concurrency=1, extra_env={"CSL_LOCK_URL": dead, "CSL_FAIL_OPEN": "1"})
    assert proj.skippy.delay("open", 0.1).get(timeout=30) == "ran"
    assert "UNLOCKED" in worker.log()


def test_stalled_lock_redis_does_not_hang_a_task(
    proj: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """A lock Redis that stops answering (SIGSTOP) while a body runs: the release call
    times out (redis-py 5 and 6 set no socket timeout of their own) and the task ends;
    nothing hangs, and the next task runs once the server answers again."""
    lock_server = RedisServer().start()
    try:
        workers(concurrency=1, extra_env={"CSL_LOCK_URL": lock_server.url})
        running = proj.skippy.delay("stall", 1.0)
        assert wait_for(lambda: data.llen("events:stall") >= 1, timeout=20)
        assert lock_server.pid is not None
        os.kill(lock_server.pid, signal.SIGSTOP)
        try:
            assert running.get(timeout=30) == "ran"
        finally:
            os.kill(lock_server.pid, signal.SIGCONT)
        assert proj.skippy.delay("after", 0.1).get(timeout=60) == "ran"
    finally:
        lock_server.stop()


def test_socket_timeout_can_be_set_in_the_url(redis_server: RedisServer) -> None:
    """The default socket timeout (5 s) gives way to one in the lock URL's query."""
    assert socket_timeout(client_from_url(redis_server.url)) == DEFAULT_SOCKET_TIMEOUT
    custom = client_from_url(redis_server.url + "?socket_timeout=12")
    assert socket_timeout(custom) == 12.0


def test_queue_scope_self_retry_while_the_lock_redis_is_down_is_not_lost(
    proj: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """A queue-scope run that calls self.retry() while the lock Redis does not answer still
    publishes its retry (the message is not dropped), and the retry runs once Redis is back."""
    # Found by the chaos soak: the hand-over's LockBackendError made Celery's retry() reject
    # the message without requeueing it.
    lock_server = RedisServer().start()
    try:
        url = lock_server.url + "?socket_timeout=1&socket_connect_timeout=1"
        worker = workers(concurrency=1, extra_env={"CSL_LOCK_URL": url})
        result = proj.retry_in_outage.delay("outage")
        assert wait_for(lambda: data.llen("events:outage") >= 1, timeout=20)
        assert lock_server.pid is not None
        os.kill(lock_server.pid, signal.SIGSTOP)
        try:
            data.set("go:outage", 1)
            assert wait_for(lambda: "publishing the retry" in worker.log(), timeout=20)
        finally:
            os.kill(lock_server.pid, signal.SIGCONT)
        assert result.get(timeout=60) == "attempt 2"
        assert "reject requeue=False" not in worker.log()
    finally:
        lock_server.stop()
