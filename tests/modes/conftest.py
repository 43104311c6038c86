"""One private redis-server and one real prefork ``celery worker`` (two pool processes,
lock metrics served in multiprocess mode) shared by the modes tests; each test uses lock
keys of its own. ``more_workers`` starts further workers for one test and stops them (by
process group) at its end."""

from __future__ import annotations

import gc
import importlib
import json
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import redis

from celery_singleton_lock.testing import CeleryWorker, RedisServer, free_port
from tests.worker.conftest import wait_for

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.modes.modesproj"


@pytest.fixture(scope="session")
def modes_redis() -> Iterator[RedisServer]:
    """Broker, result backend, lock and data Redis of these tests."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def modesproj(modes_redis: RedisServer) -> Iterator[ModuleType]:
    """The test project, imported with its environment pointing at our server."""
    os.environ["CSL_MODES_URL"] = modes_redis.url
    yield importlib.import_module(APP)
    gc.collect()  # AsyncResults unsubscribe from the backend while it still runs


@pytest.fixture(scope="session")
def metrics_port() -> int:
    """The port the shared worker serves /metrics on."""
    return free_port()


def _worker(
    modes_redis: RedisServer, tmp: Path, name: str, queues: tuple[str, ...] = (), **env: str
) -> CeleryWorker:
    return CeleryWorker(
        APP, concurrency=2, hostname=f"{name}@%h", cwd=ROOT, log_path=tmp / f"{name}.log",
        ready_timeout=120, extra_args=("-E",), queues=queues,
        env={"CSL_MODES_URL": modes_redis.url, "PYTHONPATH": str(ROOT), **env},
    )  # fmt: skip


@pytest.fixture(scope="session")
def modes_worker(
    modesproj: ModuleType,
    modes_redis: RedisServer,
    metrics_port: int,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[CeleryWorker]:
    """A prefork worker with two pool processes, the metrics server on ``metrics_port`` and
    ``PROMETHEUS_MULTIPROC_DIR`` set; stopped (by process group) at the end."""
    tmp = tmp_path_factory.mktemp("modes")
    multiproc = tmp / "prom"
    multiproc.mkdir()
    worker = _worker(
        modes_redis, tmp, "modes0", CSL_MODES_METRICS_PORT=str(metrics_port),
        PROMETHEUS_MULTIPROC_DIR=str(multiproc),
    )  # fmt: skip
    with worker:
        yield worker


@pytest.fixture
def more_workers(
    modes_worker: CeleryWorker, modes_redis: RedisServer, tmp_path: Path
) -> Iterator[Callable[..., list[CeleryWorker]]]:
    """``more_workers(n)`` starts ``n`` more prefork workers (two pool processes each) beside
    the shared one, in parallel, and returns them once all are ready; with ``own_queue``
    each consumes only a queue of its own, ``csl-modes-<its name>`` (modes1, modes2, ...)."""
    started: list[CeleryWorker] = []

    def start(count: int, own_queue: bool = False) -> list[CeleryWorker]:
        names = [f"modes{len(started) + i + 1}" for i in range(count)]
        batch = [
            _worker(
                modes_redis, tmp_path, worker, queues=(f"csl-modes-{worker}",) if own_queue else ()
            )
            for worker in names
        ]
        started.extend(batch)
        for worker in batch:
            worker.start(wait=False)
        for worker in batch:
            worker.wait_ready()
        return batch

    yield start
    for worker in started:
        worker.stop()


@pytest.fixture
def name() -> str:
    """A task argument (hence a lock key) no other test uses."""
    return uuid.uuid4().hex[:12]


@pytest.fixture
def data(modes_redis: RedisServer) -> Iterator[redis.Redis]:
    """A client of the data Redis."""
    client = redis.Redis.from_url(modes_redis.url, decode_responses=True)
    yield client
    client.close()


def ledger(data: redis.Redis, name: str, kind: str = "starts") -> list[dict[str, Any]]:
    """The ``starts`` (or ``ends``) written by the runs of ``name``, in the order written."""
    return [json.loads(raw) for raw in data.lrange(f"{kind}:{name}", 0, -1)]


def recorded(data: redis.Redis, key: str, signal: str | None = None) -> list[dict[str, Any]]:
    """The signals recorded about lock ``key`` (only ``signal`` when given), in order."""
    entries = [json.loads(raw) for raw in data.lrange(f"signals:{key}", 0, -1)]
    return [entry for entry in entries if signal is None or entry["signal"] == signal]


def wait_signal(data: redis.Redis, key: str, signal: str, timeout: float = 15) -> dict[str, Any]:
    """The first ``signal`` recorded about ``key``, waited for at most ``timeout`` s."""
    found = wait_for(lambda: recorded(data, key, signal), timeout)
    assert found, f"no {signal} about {key} within {timeout} s: {recorded(data, key)}"
    return found[0]  # type: ignore[no-any-return]
