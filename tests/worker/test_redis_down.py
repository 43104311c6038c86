"""Lock Redis down: fail closed by default, fail open only when asked; bad settings."""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any

import pytest
import redis

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


def test_bad_setting_stops_the_worker_at_start_naming_the_setting(
    proj: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """A bad singleton_lock_on_conflict makes the worker refuse to start (non-zero exit,
    a message naming the setting), so no task ever runs under it."""
    with pytest.raises(RuntimeError, match="singleton_lock_on_conflict") as failed:
        workers(concurrency=1, extra_env={"CSL_ON_CONFLICT": "explode"})
    assert "exited at start" in str(failed.value)
    assert data.llen("events:bad") == 0
