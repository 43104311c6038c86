"""One private redis-server and one real prefork ``celery worker`` (with the lock metrics
served in multiprocess mode) shared by the observability tests; each test uses lock keys
of its own, so they do not see each other's locks or signals."""

from __future__ import annotations

import gc
import importlib
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import redis

from celery_singleton_lock.testing import CeleryWorker, RedisServer, free_port
from tests.worker.conftest import wait_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def obs_redis() -> Iterator[RedisServer]:
    """Broker, result backend, lock and data Redis of these tests."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def obsproj(obs_redis: RedisServer) -> Iterator[ModuleType]:
    """The test project, imported with its environment pointing at our server."""
    os.environ["CSL_OBS_URL"] = obs_redis.url
    yield importlib.import_module("tests.observe.obsproj")
    gc.collect()  # AsyncResults unsubscribe from the backend while it still runs


@pytest.fixture(scope="session")
def metrics_port() -> int:
    """The port the worker serves /metrics on."""
    return free_port()


@pytest.fixture(scope="session")
def obs_worker(
    obsproj: ModuleType,
    obs_redis: RedisServer,
    metrics_port: int,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[CeleryWorker]:
    """A prefork worker with three pool processes, the metrics server on ``metrics_port``
    and ``PROMETHEUS_MULTIPROC_DIR`` set; stopped (by process group) at the end."""
    tmp = tmp_path_factory.mktemp("obs")
    multiproc = tmp / "prom"
    multiproc.mkdir()
    worker = CeleryWorker(
        "tests.observe.obsproj", concurrency=3, hostname="obs@%h", cwd=ROOT,
        log_path=tmp / "worker.log", ready_timeout=120, extra_args=("-E",),
        env={
            "CSL_OBS_URL": obs_redis.url,
            "CSL_OBS_METRICS_PORT": str(metrics_port),
            "PROMETHEUS_MULTIPROC_DIR": str(multiproc),
            "PYTHONPATH": str(ROOT),
        },
    )  # fmt: skip
    with worker:
        yield worker


@pytest.fixture
def name() -> str:
    """A task argument (hence a lock key) no other test uses."""
    return uuid.uuid4().hex[:12]


@pytest.fixture
def data(obs_redis: RedisServer) -> Iterator[redis.Redis]:
    """A client of the data Redis."""
    client = redis.Redis.from_url(obs_redis.url, decode_responses=True)
    yield client
    client.close()


def recorded(data: redis.Redis, key: str) -> list[dict[str, Any]]:
    """The signals recorded so far about lock ``key``, in the order they were sent."""
    return [json.loads(raw) for raw in data.lrange(f"signals:{key}", 0, -1)]


def wait_signal(data: redis.Redis, key: str, signal: str, timeout: float = 15) -> dict[str, Any]:
    """The first ``signal`` recorded about ``key``, waited for at most ``timeout`` s."""
    found = wait_for(
        lambda: [entry for entry in recorded(data, key) if entry["signal"] == signal], timeout
    )
    assert found, f"no {signal} about {key} within {timeout} s: {recorded(data, key)}"
    return found[0]  # type: ignore[no-any-return]
