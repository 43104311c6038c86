"""Real ``celery worker`` processes on a private redis-server, started and stopped by PID."""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import redis

from celery_singleton_lock.testing import RedisServer

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def worker_redis() -> Iterator[RedisServer]:
    """The broker, lock and data Redis of the worker tests (our own server)."""
    with RedisServer() as server:
        yield server


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
class Worker:
    """One ``celery worker`` process group."""

    process: subprocess.Popen[bytes]
    log: Path
    stopped: bool = False

    @property
    def pid(self) -> int:
        return self.process.pid

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def children(self) -> list[int]:
        out = subprocess.run(
            ["pgrep", "-P", str(self.pid)], capture_output=True, text=True, check=False
        )
        return [int(pid) for pid in out.stdout.split()]

    def stop(self, timeout: float = 15.0) -> None:
        """Warm shutdown (SIGTERM to the parent), then SIGKILL to the group after ``timeout``."""
        if self.stopped:
            return
        self.stopped = True
        try:
            os.kill(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        # prefork children are in the same group; make sure none is left
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)

    def kill(self) -> None:
        """SIGKILL the whole worker (parent and pool children) at once."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.process.wait(timeout=10)
        self.stopped = True


@dataclass
class WorkerFactory:
    """Starts workers for one test and stops all of them at its end."""

    tmp: Path
    env: dict[str, str]
    started: list[Worker] = field(default_factory=list)

    def __call__(
        self,
        concurrency: int = 2,
        pool: str = "prefork",
        extra_env: dict[str, str] | None = None,
        app: str = "tests.worker.proj",
        ready_timeout: float = 30.0,
    ) -> Worker:
        name = f"w{len(self.started)}-{uuid.uuid4().hex[:6]}"
        log = self.tmp / f"{name}.log"
        cmd = [
            sys.executable, "-m", "celery", "-A", app, "worker",
            "--pool", pool, "--concurrency", str(concurrency), "--hostname", f"{name}@%h",
            "--loglevel", "INFO", "--logfile", str(log),
            "--without-gossip", "--without-mingle", "--without-heartbeat",
        ]  # fmt: skip
        env = {**os.environ, **self.env, **(extra_env or {})}
        process = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        worker = Worker(process, log)
        self.started.append(worker)
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            if " ready." in worker.text():
                return worker
            if process.poll() is not None:
                raise RuntimeError(f"worker exited at start:\n{worker.text()[-3000:]}")
            time.sleep(0.1)
        worker.stop()
        raise TimeoutError(f"worker not ready:\n{worker.text()[-3000:]}")

    def beat(self, app: str = "tests.worker.proj") -> Worker:
        """Start ``celery beat`` for ``app`` with a throwaway schedule file."""
        name = f"beat{len(self.started)}"
        log = self.tmp / f"{name}.log"
        cmd = [
            sys.executable, "-m", "celery", "-A", app, "beat",
            "--schedule", str(self.tmp / f"{name}-schedule"), "--pidfile", "",
            "--loglevel", "INFO", "--logfile", str(log), "--max-interval", "1",
        ]  # fmt: skip
        process = subprocess.Popen(
            cmd, cwd=ROOT, env={**os.environ, **self.env}, stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        beat = Worker(process, log)
        self.started.append(beat)
        return beat

    def stop_all(self) -> None:
        for worker in self.started:
            worker.stop()


@pytest.fixture
def workers(
    tmp_path: Path, worker_redis: RedisServer, data: redis.Redis
) -> Iterator[Callable[..., Worker]]:
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
