"""``lock_on_lost="raise"`` on a real prefork worker (issue 25.2): a run frozen past its
lease ends with ``LockLost`` raised inside its body while its successor runs, and the
fenced resource refuses the late write it may still attempt; under ``"warn"`` the same
frozen run goes on to its end, every write refused."""

from __future__ import annotations

import importlib
import os
import signal
import time
from collections.abc import Callable
from types import ModuleType

import pytest
import redis

from celery_singleton_lock import LockLost
from celery_singleton_lock.testing import CeleryWorker, RedisServer
from tests.worker.conftest import wait_for

pytestmark = pytest.mark.slow

APP = "tests.worker.keep_proj"


@pytest.fixture(scope="module")
def keep(worker_redis: RedisServer) -> ModuleType:
    os.environ["CSL_BROKER_URL"] = worker_redis.url
    os.environ["CSL_BACKEND_URL"] = worker_redis.url.replace("/0", "/1")
    return importlib.import_module(APP)


def _freeze_first(keep: ModuleType, data: redis.Redis, name: str, **options: object) -> tuple:
    """Start a long fenced writer, freeze its pool process past its 2 s lease while a
    second writer of the same key takes over, then let it go on."""
    first = keep.fenced_writer.apply_async((name, "A", 100), **options)
    assert wait_for(lambda: data.lrange(f"accepted:{name}", 0, -1), timeout=20)
    pid = int(data.lrange(f"pid:{name}", 0, 0)[0].split()[1])
    os.kill(pid, signal.SIGSTOP)
    try:
        second = keep.fenced_writer.delay(name, "B", 10)
        assert wait_for(lambda: "B" in data.lrange(f"accepted:{name}", 0, -1), timeout=20)
    finally:
        os.kill(pid, signal.SIGCONT)
    return first, second


def _after_b(data: redis.Redis, name: str) -> list[str]:
    accepted = data.lrange(f"accepted:{name}", 0, -1)
    return accepted[accepted.index("B") :]


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_a_frozen_run_ends_with_lock_lost_and_its_late_write_is_refused(
    keep: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker], pool: str
) -> None:
    """On prefork the pool process is frozen (a signal raises LockLost in its main
    thread); on the threads pool the whole worker is, and a second worker runs the
    successor (LockLost is raised in the pool thread)."""
    workers(concurrency=2, app=APP, pool=pool)
    if pool == "threads":
        workers(concurrency=2, app=APP, pool=pool)
    first, second = _freeze_first(keep, data, f"lost-raise-{pool}")
    began = time.monotonic()
    with pytest.raises(LockLost):
        first.get(timeout=20)
    assert time.monotonic() - began < 5  # stopped at once, not after its 100 steps
    assert first.state == "FAILURE"
    assert second.get(timeout=20) == "B"
    assert "A" not in _after_b(data, f"lost-raise-{pool}")
    assert data.llen(f"refused:lost-raise-{pool}") <= 1  # at most the write in flight at the thaw


def test_under_warn_the_frozen_run_goes_on_and_every_write_is_refused(
    keep: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker]
) -> None:
    workers(concurrency=2, app=APP)
    first, second = _freeze_first(keep, data, "lost-warn", lock_on_lost="warn")
    assert first.get(timeout=30) == "A"  # ran its 100 steps
    assert second.get(timeout=20) == "B"
    assert "A" not in _after_b(data, "lost-warn")
    assert data.llen("refused:lost-warn") >= 10


@pytest.mark.parametrize("pool", ["prefork", "threads", "solo"])
def test_the_lock_lost_raised_in_the_body_names_the_tasks_lock(
    keep: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker], pool: str
) -> None:
    """Whatever the pool (a signal on the main thread for prefork and solo, an asynchronous
    exception in the pool thread for threads), the ``LockLost`` that a body catches carries
    the name of the task's lock, once an operator deletes its key."""
    workers(concurrency=2, app=APP, pool=pool)
    name = f"lost-name-{pool}"
    key = keep.lost_key_recorder.lock_key(name)
    result = keep.lost_key_recorder.delay(name)
    assert wait_for(lambda: data.lrange(f"started:{name}", 0, -1), timeout=30)
    assert data.lrange(f"started:{name}", 0, -1) == [key]
    data.delete(key)  # the lease is gone: the renewer finds the key taken away
    assert result.get(timeout=60) == "lost"
    assert data.lrange(f"caught:{name}", 0, -1) == [repr(key)]
