"""Real ``celery worker`` processes on a private redis-server, started and stopped by PID."""

from __future__ import annotations

import gc
import importlib
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import redis

from celery_singleton_lock.testing import CeleryBeat, CeleryProcess, CeleryWorker, RedisServer

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def worker_redis() -> Iterator[RedisServer]:
    """The broker, lock and data Redis of the worker tests (our own server)."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session", autouse=True)
def _results_collected_while_redis_runs(worker_redis: RedisServer) -> Iterator[None]:
    """Collect leftover AsyncResults before the session's Redis stops: their finalizers
    unsubscribe from the result backend, which Celery 5.3 retries for minutes once the
    server is gone (pytest would hang at exit)."""
    yield
    gc.collect()


@pytest.fixture(scope="session")
def proj(worker_redis: RedisServer) -> ModuleType:
    """The test Celery project, imported with its environment pointing at our server."""
    os.environ["CSL_BROKER_URL"] = worker_redis.url
    os.environ["CSL_BACKEND_URL"] = worker_redis.url.replace("/0", "/1")
    return importlib.import_module("tests.worker.proj")


@pytest.fixture
def data(worker_redis: RedisServer, proj: ModuleType) -> Iterator[redis.Redis]:
    """The data Redis, emptied before each test (it is our private server)."""
    client = redis.Redis.from_url(worker_redis.url, decode_responses=True)
    client.flushall()
    yield client
    client.close()


@dataclass
class WorkerFactory:
    """Starts workers for one test and stops all of them at its end."""

    tmp: Path
    env: dict[str, str]
    started: list[CeleryProcess] = field(default_factory=list)

    def __call__(
        self,
        concurrency: int = 2,
        pool: str = "prefork",
        extra_env: dict[str, str] | None = None,
        app: str = "tests.worker.proj",
        ready_timeout: float = 120.0,
        queues: tuple[str, ...] = (),
        extra_args: tuple[str, ...] = (),
    ) -> CeleryWorker:
        name = f"w{len(self.started)}-{uuid.uuid4().hex[:6]}"
        worker = CeleryWorker(
            app, pool=pool, concurrency=concurrency, hostname=f"{name}@%h",
            env={**self.env, "CSL_WORKER_POOL": pool, **(extra_env or {})}, cwd=ROOT,
            log_path=self.tmp / f"{name}.log", ready_timeout=ready_timeout, queues=queues,
            extra_args=extra_args,
        )  # fmt: skip
        self.started.append(worker)
        return worker.start()

    def beat(self, app: str = "tests.worker.proj") -> CeleryBeat:
        """Start ``celery beat`` for ``app`` with a throwaway schedule file (not waited for)."""
        name = f"beat{len(self.started)}"
        beat = CeleryBeat(
            app, schedule=self.tmp / f"{name}-schedule", max_interval=1, env=self.env, cwd=ROOT,
            log_path=self.tmp / f"{name}.log", name=name,
        )  # fmt: skip
        self.started.append(beat)
        beat.start(wait=False)
        return beat

    def stop_all(self) -> None:
        for process in self.started:
            process.stop()


@pytest.fixture
def workers(
    tmp_path: Path, worker_redis: RedisServer, data: redis.Redis
) -> Iterator[Callable[..., CeleryWorker]]:
    """Start real workers with ``workers(concurrency=2, pool="prefork")``; all are stopped
    (by process group) when the test ends."""
    factory = WorkerFactory(
        tmp=tmp_path,
        env={
            "CSL_BROKER_URL": worker_redis.url,
            "CSL_BACKEND_URL": worker_redis.url.replace("/0", "/1"),
            "PYTHONPATH": str(ROOT),
        },
    )
    yield factory
    factory.stop_all()


def wait_for(predicate: Callable[[], Any], timeout: float, interval: float = 0.05) -> Any:
    """Poll ``predicate`` until truthy or ``timeout`` seconds pass; return its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def admitted_at(data: redis.Redis, name: str) -> list[int]:
    """When ``lock_rate_limit`` admitted each run of ``name``, in server ms, oldest first (as
    the bodies copied it from the starts set): the rate is judged on these, never on when
    the bodies got to their ledger, which varies with load."""
    return sorted(int(ms) for ms in data.hgetall(f"admitted-at:{name}").values())
