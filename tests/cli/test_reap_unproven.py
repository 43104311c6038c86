"""``celery locks reap`` takes no answer for proof: against real workers that cannot answer
``inspect`` (a solo worker busy in its body, remote control off), a task whose lease is
longer than the app's, and queued holds whose message waits outside the default queue,
it frees nothing and says "unproven" where it cannot tell; a hold whose lease ran out,
whose worker was killed whole, or whose message is gone is still freed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from celery_singleton_lock import RedisLock
from celery_singleton_lock.testing import CeleryWorker, RedisServer
from tests.cli import reapproj
from tests.cli.conftest import ROOT

pytestmark = pytest.mark.slow

Reap = Callable[..., "subprocess.CompletedProcess[str]"]


@pytest.fixture
def env(redis_server: RedisServer, prefix: str) -> dict[str, str]:
    """The environment of this test's workers and CLI runs."""
    return {"PYTHONPATH": str(ROOT), "CSL_CLI_URL": redis_server.url, "CSL_CLI_PREFIX": prefix}


@pytest.fixture
def app(redis_server: RedisServer, prefix: str) -> Celery:
    """This test's app, built in the test process to publish and compute keys."""
    return reapproj.make_app(redis_server.url, prefix)


@pytest.fixture
def reap(env: dict[str, str]) -> Reap:
    """Run ``celery -A tests.cli.reapproj locks reap ARGS...``; returns the finished process."""

    def run_reap(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "celery", "-A", "tests.cli.reapproj", "locks", "reap", *args],
            cwd=ROOT, env={**os.environ, **env, **extra}, stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=240, check=False,
        )  # fmt: skip

    return run_reap


@pytest.fixture
def workers(tmp_path: Path, env: dict[str, str], prefix: str) -> Iterator[Callable[..., Any]]:
    """Start a real worker of the project on this test's default queue; all are stopped
    (by process group) at the end."""
    started: list[CeleryWorker] = []

    def start(pool: str = "prefork", **extra: str) -> CeleryWorker:
        name = f"reap{len(started)}-{uuid.uuid4().hex[:6]}"
        worker = CeleryWorker(
            "tests.cli.reapproj", pool=pool, concurrency=1, hostname=f"{name}@%h",
            queues=[reapproj.default_queue(prefix)], env={**env, **extra}, cwd=ROOT,
            log_path=tmp_path / f"{name}.log", ready_timeout=120,
        )  # fmt: skip
        started.append(worker)
        worker.start()
        return worker

    yield start
    for worker in started:
        worker.stop()


def wait_for(predicate: Callable[[], Any], timeout: float) -> Any:
    """Poll ``predicate`` until truthy or ``timeout`` seconds pass; its last value."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


def start_run(
    app: Celery, client: redis.Redis, prefix: str, task: str, seconds: float
) -> tuple[str, str, bytes]:
    """Publish ``task`` (tag of its own, running ``seconds`` unless :func:`end_run` ends
    it first), wait until its body started; its lock key, task id and the lock value then."""
    tag = uuid.uuid4().hex[:8]
    result = app.tasks[task].delay(tag, seconds)
    key = app.tasks[task].lock_key(tag, seconds)
    assert wait_for(lambda: client.llen(reapproj.started_key(prefix, tag)), 60), "never started"
    value = client.get(key)
    assert value is not None
    return key, str(result.id), value


def end_runs(client: redis.Redis, prefix: str) -> None:
    """End now every run this test started (:func:`start_run`; ``prefix`` is the test's)."""
    for started in client.scan_iter(reapproj.started_key(prefix, "*")):
        tag = started.decode().rsplit(":", 1)[-1]
        client.set(reapproj.go_key(prefix, tag), 1)


def same_hold(client: redis.Redis, key: str, value: bytes) -> bool:
    """Whether ``key`` is still held by the owner token of ``value`` (its run's hold)."""
    now = client.get(key)
    return now is not None and now.split(b":")[3] == value.split(b":")[3]


@pytest.mark.parametrize("pool", ["solo", "remote-control-off"])
def test_a_run_whose_worker_cannot_answer_is_not_freed(
    app: Celery, client: redis.Redis, prefix: str, workers: Any, reap: Reap, pool: str
) -> None:
    """A 30 s lease renews every 10 s; reap watching 0.5 s sees no renewal, and the worker
    cannot answer inspect (solo pool busy in the body, or remote control off). That proves
    nothing: the hold is reported unproven and left, and the run ends holding it."""
    if pool == "solo":
        workers(pool="solo")
    else:
        workers(pool="prefork", CSL_REAP_REMOTE="0")
    key, task_id, value = start_run(app, client, prefix, "reap.long", 60.0)
    # a renewal may fall in a 0.5 s watch (one every 10 s): reap then rightly sees the hold
    # alive and lists nothing; look again (never freed either way) until a watch missed it
    for dry_run in ((), ("--dry-run",)):
        for _ in range(5):
            done = reap(*dry_run, "--watch", "0.5")
            assert done.returncode == 0, done.stderr
            assert "freed" not in done.stdout
            assert "would free" not in done.stdout
            assert same_hold(client, key, value), "the running task's lock was freed"
            if key in done.stdout:
                break
            assert "nothing to reap" in done.stdout, done.stdout  # seen renewed: alive
        assert f"unproven {key} task {task_id}: watched" in done.stdout, done.stdout
        assert "nothing to reap (1 unproven)" in done.stdout
    end_runs(client, prefix)
    assert wait_for(lambda: client.get(key) is None, 30), "the run did not release its lock"


def test_a_lease_three_times_the_apps_is_watched_for_its_own_renewal(
    app: Celery, client: redis.Redis, prefix: str, workers: Any, reap: Reap
) -> None:
    """The task leases 18 s (the app 6 s): it renews every 6 s, past a third of the app's
    lease plus a second. Reap's default watch is the hold's own renewal interval, so it
    sees the renewal: the hold is alive, not listed, never freed (no worker answers)."""
    workers(pool="prefork", CSL_REAP_REMOTE="0")
    # the run lasts until the test ends it (not a fixed 11 s that reap's start, under
    # load, could outlast)
    key, _task_id, value = start_run(app, client, prefix, "reap.triple", 60.0)
    done = reap()
    assert done.returncode == 0, done.stderr
    assert key not in done.stdout, done.stdout
    assert "nothing to reap" in done.stdout
    assert same_hold(client, key, value), "the running task's lock was freed"
    assert client.get(key) != value, "reap returned before the lease was renewed"
    end_runs(client, prefix)
    assert wait_for(lambda: client.get(key) is None, 30), "the run did not release its lock"


def publish_queued(
    app: Celery, client: redis.Redis, prefix: str, where: str
) -> tuple[str, str, str]:
    """Publish a queue-scope call (no worker consumes) whose message goes to ``where``: the
    queue ``task_routes`` names, a queue given to ``apply_async``, or the default queue's
    priority list. Its lock key, task id and the Redis list holding the message."""
    tag = uuid.uuid4().hex[:8]
    if where == "task_routes":
        task, options, queue = "reap.routed", {}, reapproj.routed_queue(prefix)
    elif where == "apply_async(queue=)":
        queue = f"{prefix}-adhoc"
        task, options = "reap.queued", {"queue": queue}
    else:
        task, options = "reap.queued", {"priority": 5}
        queue = reapproj.default_queue(prefix) + "\x06\x163"
    result = app.tasks[task].apply_async((tag,), **options)
    key = app.tasks[task].lock_key(tag)
    assert client.llen(queue) == 1, f"the message is not in {queue!r}"
    assert b'"queued":true' in (client.get(key) or b"")
    return key, str(result.id), queue


@pytest.mark.parametrize("where", ["task_routes", "apply_async(queue=)", "priority"])
def test_a_queued_hold_stays_while_its_message_waits_outside_the_default_queue(
    app: Celery, client: redis.Redis, prefix: str, reap: Reap, where: str
) -> None:
    """A hold taken at publish whose message waits in a routed queue, a queue named by the
    call, or a priority list (``<queue>\\x06\\x163``) is alive: nothing is reaped. Once the
    message is gone, the hold is freed as "in no queue"."""
    key, task_id, queue = publish_queued(app, client, prefix, where)
    kept = reap("--watch", "0.3")
    assert kept.returncode == 0, kept.stderr
    assert "nothing to reap" in kept.stdout, kept.stdout
    assert key not in kept.stdout
    assert client.get(key) is not None
    client.delete(queue)
    freed = reap("--watch", "0.3")
    assert f"freed {key} task {task_id}: taken at publish, but its message is in no queue" in (
        freed.stdout
    ), freed.stdout
    assert client.get(key) is None


def test_a_router_function_leaves_a_queued_hold_unproven(
    app: Celery, client: redis.Redis, prefix: str, reap: Reap
) -> None:
    """With a router function in task_routes the queues a message may be in cannot be
    listed: a queued hold whose message is nowhere to be seen is unproven, not freed."""
    key, task_id, queue = publish_queued(app, client, prefix, "apply_async(queue=)")
    client.delete(queue)
    done = reap("--watch", "0.3", CSL_REAP_ROUTER="function")
    assert done.returncode == 0, done.stderr
    assert f"unproven {key} task {task_id}: taken at publish" in done.stdout, done.stdout
    assert "cannot be listed" in done.stdout
    assert client.get(key) is not None


def test_a_hold_whose_lease_ran_out_is_freed(
    client: redis.Redis, prefix: str, app: Celery, reap: Reap
) -> None:
    """A hold of a host reap cannot look at, not renewed: once its lease runs out while reap
    watches, it is proven gone and freed at once (waking its waiters), well before the
    watch ends."""
    key = app.tasks["reap.long"].lock_key("expiring", 1.0)
    info = {"task_id": "gone-task", "task": "reap.long", "host": "box-9", "pid": 4242}
    assert RedisLock(client, key, timeout=4.0, holder_info=info).acquire(blocking=False)
    # The value's lease ends in 4 s; the key itself is kept well past that, so it is still
    # there when reap, on a busy machine, gets to free it (its own TTL, the lease plus a
    # grace, could otherwise take it first, and reap would find it gone, not free it).
    client.pexpire(key, 600_000)
    started = time.monotonic()
    done = reap("--watch", "300")
    assert done.returncode == 0, done.stderr
    assert f"freed {key} task gone-task: its lease ran out without a renewal" in done.stdout, (
        done.stdout + done.stderr
    )
    # at once, not at the watch's end: a 4 s lease against a 300 s watch (the reap process
    # is killed at 240 s), so this bound leaves minutes for a busy machine
    assert time.monotonic() - started < 200
    assert client.get(key) is None


def test_the_hold_of_a_worker_killed_whole_is_freed(
    app: Celery, client: redis.Redis, prefix: str, workers: Any, reap: Reap
) -> None:
    """The whole worker (parent and pool) is SIGKILLed mid-run, so nobody releases nor
    renews its 30 s lease and its message is gone (acknowledged as the run started): its
    process is gone, so reap frees the hold at once."""
    worker = workers(pool="prefork")
    key, task_id, value = start_run(app, client, prefix, "reap.long", 60.0)
    worker.kill()
    assert same_hold(client, key, value)
    dry = reap("--dry-run", "--watch", "0.5")
    assert f"would free {key} task {task_id}: not renewed while watched, and its process" in (
        dry.stdout
    ), dry.stdout
    assert same_hold(client, key, value)
    done = reap("--watch", "0.5")
    assert done.returncode == 0, done.stderr
    assert f"freed {key} task {task_id}" in done.stdout, done.stdout
    assert client.get(key) is None
