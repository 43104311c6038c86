"""``celery_singleton_lock.testing.CeleryWorker``: a real worker, started and stopped by group."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery

from celery_singleton_lock.testing import CeleryWorker, RedisServer, process_group_alive

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def server() -> Iterator[RedisServer]:
    """A private redis-server: broker, result backend and locks of the tiny app."""
    with RedisServer() as started:
        yield started


def tiny_worker(
    server: RedisServer, tmp_path: Path, app: str = "tests.worker.tinyapp"
) -> CeleryWorker:
    """A worker of ``app`` whose only broker is the one the helper passes (``--broker``)."""
    return CeleryWorker(
        app, broker_url=server.url, concurrency=2, hostname="tiny@%h", cwd=ROOT,
        env={"CSL_TINY_BACKEND": server.url, "PYTHONPATH": str(ROOT)},
        log_path=tmp_path / "tiny.log", ready_timeout=120,
    )  # fmt: skip


def test_worker_runs_a_task_and_stop_leaves_no_process(server: RedisServer, tmp_path: Path) -> None:
    """The context manager returns a ready worker with its two pool children; a task sent
    to it runs; on exit no process of its group is left."""
    client = Celery("client", broker=server.url, backend=server.url, set_as_current=False)
    with tiny_worker(server, tmp_path) as worker:
        assert " ready." in worker.log()
        pool = worker.children()
        assert len(pool) == 2
        assert all(os.getpgid(pid) == worker.pid for pid in pool)
        result = client.send_task("tiny.double", (21,), queue="tiny")
        assert result.get(timeout=20) == 42
        result.forget()
    assert not process_group_alive(worker.pid)
    assert not worker.alive()
    assert "Warm shutdown" in worker.log()  # SIGTERM first: Celery's warm shutdown


def test_kill_leaves_no_process_of_the_group(server: RedisServer, tmp_path: Path) -> None:
    """``kill()`` SIGKILLs parent and pool at once and returns once the group is empty."""
    worker = tiny_worker(server, tmp_path).start()
    try:
        assert worker.children()
        assert process_group_alive(worker.pid)
        worker.kill()
        assert not process_group_alive(worker.pid)
        assert worker.process is not None
        assert worker.process.returncode == -9
    finally:
        worker.close()


def test_a_worker_that_cannot_start_raises_with_its_output(
    server: RedisServer, tmp_path: Path
) -> None:
    """An app module that does not exist: ``start()`` raises RuntimeError quoting celery's
    error (not a timeout), and nothing of the group is left."""
    worker = tiny_worker(server, tmp_path, app="tests.worker.no_such_app")
    with pytest.raises(RuntimeError, match="exited at start") as failed:
        worker.start()
    assert "no_such_app" in str(failed.value)
    assert not process_group_alive(worker.pid)


def test_process_group_alive_sees_a_running_group() -> None:
    """This test's own process group is alive."""
    assert process_group_alive(os.getpgid(0))
