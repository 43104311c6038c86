"""Fixtures of the compat tests: a private redis-server of their own, producer-side apps,
and real ``celery worker`` processes running ``tests.compat.compat_proj``.

``test_upstream.py`` (celery-singleton's and celery-once's own public tests, run against
the shims) is collected only when ``CSL_UPSTREAM_SINGLETON`` or ``CSL_UPSTREAM_ONCE`` names
a checkout of that project: without one it is not collected at all, rather than skipped.
"""

from __future__ import annotations

import gc
import importlib
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import redis
from celery import Celery

from celery_singleton_lock.testing import CeleryWorker, RedisServer

ROOT = Path(__file__).resolve().parents[2]

collect_ignore = (
    []
    if os.environ.get("CSL_UPSTREAM_SINGLETON") or os.environ.get("CSL_UPSTREAM_ONCE")
    else ["test_upstream.py"]
)


def db_url(server: RedisServer, db: int) -> str:
    """The URL of database ``db`` of ``server``."""
    return server.url.removesuffix("/0") + f"/{db}"


@pytest.fixture(scope="session")
def compat_redis() -> Iterator[RedisServer]:
    """The compat tests' own redis-server: broker db 0, results and celery-singleton's
    locks db 1, celery-once's locks db 2, task records db 3."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session", autouse=True)
def _results_collected_while_redis_runs(compat_redis: RedisServer) -> Iterator[None]:
    """Collect leftover AsyncResults before the server stops (their finalizers talk to the
    result backend)."""
    yield
    gc.collect()


@pytest.fixture
def make_app(compat_redis: RedisServer) -> Iterator[Callable[..., Celery]]:
    """``make_app(**conf)``: a new producer app on the private server, with a queue of its
    own (nothing consumes it) and no result backend unless given."""
    apps: list[Celery] = []

    def make(**conf: Any) -> Celery:
        app = Celery(f"compat-{uuid.uuid4().hex[:8]}", set_as_current=False)
        app.conf.update(
            broker_url=compat_redis.url,
            task_default_queue=f"compat-{uuid.uuid4().hex[:8]}",
            broker_connection_retry_on_startup=True,
        )
        app.conf.update(conf)
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.close()


@pytest.fixture
def db(compat_redis: RedisServer) -> Callable[[int], redis.Redis]:
    """``db(n)``: a client of database ``n`` of the private server (closed at the end)."""
    clients: list[redis.Redis] = []

    def client(number: int) -> redis.Redis:
        conn = redis.Redis.from_url(db_url(compat_redis, number), decode_responses=True)
        clients.append(conn)
        return conn

    yield client  # type: ignore[misc]
    for conn in clients:
        conn.close()


def _proj_env(server: RedisServer, lease: float | None = None) -> dict[str, str]:
    env = {
        "CSL_COMPAT_BROKER": db_url(server, 0),
        "CSL_COMPAT_BACKEND": db_url(server, 1),
        "CSL_COMPAT_ONCE": db_url(server, 2),
        "CSL_COMPAT_DATA": db_url(server, 3),
        "PYTHONPATH": str(ROOT),
    }
    if lease is not None:
        env["CSL_COMPAT_LEASE"] = str(lease)
    return env


@pytest.fixture(scope="session")
def compat_proj(compat_redis: RedisServer) -> ModuleType:
    """``tests.compat.compat_proj`` imported with its environment on the private server."""
    for name, value in _proj_env(compat_redis).items():
        if name != "PYTHONPATH":
            os.environ[name] = value
    return importlib.import_module("tests.compat.compat_proj")


@pytest.fixture(scope="module")
def compat_worker(
    compat_redis: RedisServer, compat_proj: ModuleType, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CeleryWorker]:
    """One real prefork worker (two processes) for a test module; stopped by PID."""
    log = tmp_path_factory.mktemp("compat-worker") / "worker.log"
    worker = CeleryWorker(
        "tests.compat.compat_proj", concurrency=2, env=_proj_env(compat_redis), cwd=ROOT,
        log_path=log, hostname=f"compat-{uuid.uuid4().hex[:6]}@%h", ready_timeout=120,
    )  # fmt: skip
    worker.start()
    yield worker
    worker.stop()


@pytest.fixture
def start_worker(
    compat_redis: RedisServer, tmp_path: Path
) -> Iterator[Callable[..., CeleryWorker]]:
    """``start_worker(queue, lease=...)``: a worker of this test's own (to be killed) that
    consumes only ``queue``; every worker started is stopped at the end."""
    started: list[CeleryWorker] = []

    def start(queue: str, lease: float | None = None, concurrency: int = 1) -> CeleryWorker:
        worker = CeleryWorker(
            "tests.compat.compat_proj", concurrency=concurrency, queues=[queue],
            env=_proj_env(compat_redis, lease), cwd=ROOT, log_path=tmp_path / "worker.log",
            hostname=f"compat-own-{uuid.uuid4().hex[:6]}@%h", ready_timeout=120,
        )  # fmt: skip
        started.append(worker)
        return worker.start()

    yield start
    for worker in started:
        worker.stop()


def wait_for(predicate: Callable[[], Any], timeout: float, interval: float = 0.02) -> Any:
    """Poll ``predicate`` until truthy or ``timeout`` seconds pass; return its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def unique(label: str) -> str:
    """A name no other test uses (tests share the server and never flush it)."""
    return f"{label}-{uuid.uuid4().hex[:10]}"
