"""``celery locks reap`` against real workers: a run a live worker reports is never freed,
even when its lease is not renewed; the hold of a worker killed as a whole is."""

from __future__ import annotations

import os
import subprocess
import sys
from types import ModuleType
from typing import Any

import pytest
import redis

from celery_singleton_lock.testing import RedisServer
from tests.worker.conftest import ROOT, wait_for

pytestmark = pytest.mark.slow


def _reap(worker_redis: RedisServer, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CSL_BROKER_URL": worker_redis.url}
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.worker.proj", "locks", "reap", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_reap_never_frees_a_running_tasks_lock(
    proj: ModuleType, data: redis.Redis, workers: Any, worker_redis: RedisServer
) -> None:
    """A 20 s run with lock_renew=False on a live worker: its lease does not move while reap
    watches, yet the worker lists it as active, so reap leaves it."""
    workers(concurrency=2)
    result = proj.unrenewed.delay("busy", 20.0)
    assert wait_for(lambda: data.llen("started:busy") == 1, timeout=30)
    key = proj.unrenewed.lock_key("busy", 20.0)
    done = _reap(worker_redis, "--watch", "1.0")
    assert done.returncode == 0, done.stderr
    assert "nothing to reap" in done.stdout
    assert data.get(key) is not None
    result.revoke(terminate=True, signal="SIGKILL")


def test_reap_frees_the_hold_of_a_worker_killed_whole(
    proj: ModuleType, data: redis.Redis, workers: Any, worker_redis: RedisServer
) -> None:
    """The whole worker (parent and pool) is SIGKILLed mid-run, so nobody releases nor
    renews its 60 s lease: reap frees it at once, and the same call then runs."""
    worker = workers(concurrency=2)
    proj.unrenewed.delay("orphan", 30.0)
    assert wait_for(lambda: data.llen("started:orphan") == 1, timeout=30)
    key = proj.unrenewed.lock_key("orphan", 30.0)
    worker.kill()
    assert data.get(key) is not None
    done = _reap(worker_redis, "--watch", "0.5")
    assert done.returncode == 0, done.stderr
    assert f"freed {key}" in done.stdout
    assert data.get(key) is None
    workers(concurrency=2)
    assert proj.unrenewed.delay("orphan", 0.0).get(timeout=30) == "ran"
