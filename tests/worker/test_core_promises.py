"""Issue 22: the core keeps its promises under canvases, retries and containers (real prefork
workers, private Redis). Each test failed before the fix it names."""

from __future__ import annotations

import importlib
import json
import logging
import os
import signal
import socket
import time
import uuid
from collections.abc import Callable
from types import ModuleType

import pytest
import redis
from celery import chain, chord, group

from celery_singleton_lock import LockedTask, TaskLocked
from celery_singleton_lock.testing import CeleryWorker, RedisServer
from tests.worker.conftest import wait_for

pytestmark = pytest.mark.slow

APP = "tests.worker.keep_proj"


@pytest.fixture(scope="module")
def keep(worker_redis: RedisServer) -> ModuleType:
    os.environ["CSL_BROKER_URL"] = worker_redis.url
    os.environ["CSL_BACKEND_URL"] = worker_redis.url.replace("/0", "/1")
    return importlib.import_module(APP)


def _start(workers: Callable[..., CeleryWorker], concurrency: int = 2) -> CeleryWorker:
    return workers(concurrency=concurrency, app=APP)


# -- 22.3: a deduplicated canvas member never leaves its canvas hanging ------------------


def test_a_duplicate_in_a_chain_raises_instead_of_dropping_the_rest(
    keep: ModuleType, data: redis.Redis
) -> None:
    """A chain whose first task is a queue-scope duplicate (the key is queued already)
    used to get the holder's AsyncResult back, and the rest of the chain never ran; now
    publishing it raises TaskLocked saying so, and nothing is published."""
    first = keep.queued_job.delay("canvas", 1)  # no worker: it stays queued, holding the key
    with pytest.raises(TaskLocked, match=r"part of a canvas \(chain\)"):
        chain(keep.queued_job.s("canvas", 2), keep.after.s()).apply_async()
    assert first.id
    assert data.llen("csl-keep") == 1


def test_a_duplicate_chord_member_raises_instead_of_hanging_the_chord(
    keep: ModuleType, data: redis.Redis
) -> None:
    """A chord whose header holds a queue-scope duplicate would wait for ever for that
    member; its publish raises instead."""
    keep.queued_job.delay("chorded", 1)
    header = [keep.queued_job.s("chorded", 2), keep.queued_job.s("other", 3)]
    with pytest.raises(TaskLocked, match="part of a canvas"):
        chord(header)(keep.after.s())


def test_a_duplicate_group_member_raises_instead_of_hanging_the_group(
    keep: ModuleType, data: redis.Redis
) -> None:
    """A group's result waits for the ids the group gave its members; a queue-scope
    duplicate publishes nothing under its id, so the group would wait for ever: the publish
    raises instead."""
    keep.queued_job.delay("grouped", 1)
    with pytest.raises(TaskLocked, match=r"part of a canvas \(group_id\)"):
        group(keep.queued_job.s("grouped", 2), keep.queued_job.s("solo", 3)).apply_async()


# -- 22.4: a hostname shared across PID namespaces is not "this host" ---------------------


def _plant(data: redis.Redis, key: str, task_id: str, pid: int, namespace: str) -> None:
    """Plant a hold of ``task_id`` naming a process of ``namespace`` on this hostname."""
    with open("/proc/sys/kernel/random/boot_id") as boot_file:
        boot = boot_file.read().strip()
    seconds, micros = (int(part) for part in data.time())
    now_ms = seconds * 1000 + micros // 1000
    info = {
        "task_id": task_id,
        "task": "tests.worker.keep_proj.plain_job",
        "host": socket.gethostname(),
        "pid": pid,
        "proc": f"{boot}/{namespace}/{pid}/1",
    }
    value = f"{now_ms + 20_000}:0:earlier-delivery:{seconds * 1_000_000 + micros}:"
    data.set(key, value + json.dumps(info, sort_keys=True), px=25_000)


def test_a_holder_in_another_pid_namespace_is_left_to_its_lease(
    keep: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker]
) -> None:
    """An earlier delivery of the message holds the key in a container with the same
    hostname but another PID namespace; its pid does not exist here, which used to count
    as "its process is gone", and the redelivery took the lock over and ran beside it."""
    worker = _start(workers)
    task_id = str(uuid.uuid4())
    key = keep.plain_job.lock_key("ns", 1)
    _plant(data, key, task_id, 99_999_999, "pid:[1]")
    result = keep.plain_job.apply_async(("ns", 1), task_id=task_id)
    time.sleep(4.0)
    assert not result.ready()
    assert data.llen("runs:ns") == 0
    assert "took over the lock its dead earlier delivery held" not in worker.log()


def test_a_dead_holder_in_this_pid_namespace_is_taken_over(
    keep: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker]
) -> None:
    """The same hold naming a process of this very namespace that no longer runs is taken
    over at once (no need to wait out its lease)."""
    _start(workers)
    task_id = str(uuid.uuid4())
    key = keep.plain_job.lock_key("ns-here", 1)
    _plant(data, key, task_id, 99_999_999, os.readlink("/proc/self/ns/pid"))
    result = keep.plain_job.apply_async(("ns-here", 1), task_id=task_id)
    assert result.get(timeout=30) == 1


# -- 22.5: a message the worker drops gives its queue lock back ---------------------------


def test_an_unknown_task_gives_its_queue_lock_back(
    keep: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker]
) -> None:
    """A queue-scope task that only the producer knows (a rolling deploy): the worker drops
    its message as unknown, and the lock its publish took is freed instead of swallowing
    every call with those arguments for lock_queue_timeout."""

    @keep.app.task(name="tests.worker.keep_proj.only_here", base=LockedTask, lock_scope="queue",
                   shared=False)  # fmt: skip
    def only_here(name: str) -> str:
        return name

    key = only_here.lock_key("deploy")
    only_here.delay("deploy")
    assert data.exists(key)
    worker = _start(workers)
    assert wait_for(lambda: not data.exists(key), timeout=20), worker.log()
    # the worker logs it just after the release: give the line a moment to reach the file
    assert wait_for(lambda: "dropped its message" in worker.log(), timeout=30), worker.log()


# -- 22.6: the parent frees the key a call really locked ---------------------------------


def test_a_killed_runs_per_call_key_is_freed_by_the_parent(
    keep: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker]
) -> None:
    """A call made with apply_async(lock_keys=["name"]) locks a key other than the task's
    default; when its pool process is killed, the parent frees that key at once (it used
    to look under the default key and leave the real one to its 30 s lease). Judged on the
    server's clock: the key is gone before that lease could have ended."""
    _start(workers)
    seconds, micros = data.time()  # type: ignore[misc]
    published = int(seconds) * 1000 + int(micros) // 1000
    keep.killable.apply_async(("percall", 60.0), lock_keys=["name"])
    key = keep.killable.lock_key("percall", 60.0)  # the default key: every argument
    assert wait_for(lambda: data.lindex("pids:percall", 0), timeout=30)
    real = [
        name for name in data.scan_iter("csl:tests.worker.keep_proj.killable:*") if "}:" not in name
    ]
    assert len(real) == 1
    assert real[0] != key
    os.kill(int(data.lindex("pids:percall", 0) or 0), signal.SIGKILL)
    assert wait_for(lambda: not data.exists(real[0]), timeout=60)
    seconds, micros = data.time()  # type: ignore[misc]
    # taken after the publish under a 30 s lease: gone before its end, so freed, not expired
    assert int(seconds) * 1000 + int(micros) // 1000 < published + 30_000


# -- 22.7: a lost lease is told also when the run retries --------------------------------


def test_a_lost_lease_is_told_when_the_run_retries(
    keep: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker]
) -> None:
    """A queue-scope run outlives its unrenewed lease and calls self.retry(): the loss is
    logged and signalled (lock_lost) as at the end of any run; it used to pass silently."""
    worker = _start(workers)
    result = keep.outlives_its_lease.delay("lost")
    assert result.get(timeout=30) == "second"
    assert "was lost while the task ran" in worker.log()


# -- 22.9: a task id that already ran is a warning, naming the rule ----------------------


def test_a_new_job_with_a_finished_task_id_is_a_warning(
    keep: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker],
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """apply_async with the explicit task id of a finished call publishes nothing: said at
    WARNING with the rule (it was an INFO line)."""
    _start(workers)
    task_id = str(uuid.uuid4())
    assert keep.queued_job.apply_async(("once", 1), task_id=task_id).get(timeout=20) == 1
    with caplog.at_level(logging.INFO, logger="celery_singleton_lock.task"):
        again = keep.queued_job.apply_async(("once", 2), task_id=task_id)
    assert again.id == task_id
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and task_id in r.message]
    assert warnings, caplog.text
    assert "a task id runs once" in warnings[0].message
