"""``celery locks reap`` frees only holds whose holder is proven gone, and ``locks list``
shows holders with their state, the waiters in order and the pending follow-up."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from typing import Any

import redis

from celery_singleton_lock import RedisLock
from celery_singleton_lock.engine.keyspace import companion_key
from celery_singleton_lock.testing import RedisServer
from tests.cli.conftest import ROOT, Run
from tests.cli.test_cli import TASK, buy_key, hold

#: Takes a lock as a run of ``shop.buy`` in this process would (host, pid and the process
#: identity in its holder info), then exits without releasing it.
_DIE_HOLDING = """
import os, sys
import redis
from celery_singleton_lock import RedisLock
from celery_singleton_lock.runtime.process import HOST, process_identity
url, key, task_id, task = sys.argv[1:5]
info = {"task_id": task_id, "task": task, "host": HOST, "pid": os.getpid(),
        "proc": process_identity()}
assert RedisLock(redis.Redis.from_url(url), key, timeout=30.0, holder_info=info).acquire(
    blocking=False)
os._exit(0)
"""


def hold_of_a_dead_process(url: str, key: str, task_id: str) -> None:
    """A hold on ``key`` by task ``task_id`` whose process is gone (it exited holding it)."""
    subprocess.run(
        [sys.executable, "-c", _DIE_HOLDING, url, key, task_id, TASK],
        cwd=ROOT, check=True, timeout=240,
    )  # fmt: skip


def test_a_hold_nobody_renews_or_runs_is_reaped(
    run: Run, client: redis.Redis, prefix: str, redis_server: RedisServer
) -> None:
    """A hold left by a task whose process is gone (this host), that no worker runs and
    nobody renews, is freed (owner-checked), with one line naming key, task id and why; a
    dry run before it frees nothing."""
    key = buy_key(prefix, ["sku-9"])
    hold_of_a_dead_process(redis_server.url, key, "dead-task")
    dry = run("reap", "--dry-run", "--watch", "0.3")
    assert dry.returncode == 0, dry.stderr
    assert f"would free {key} task dead-task: not renewed while watched" in dry.stdout
    assert client.get(key) is not None
    done = run("reap", "--watch", "0.3")
    assert done.returncode == 0, done.stderr
    assert f"freed {key} task dead-task" in done.stdout
    assert client.get(key) is None


def test_a_hold_of_a_host_reap_cannot_see_is_unproven(
    run: Run, client: redis.Redis, prefix: str
) -> None:
    """The same hold by a process on another host, with no worker answering: its run may go
    on in a worker that cannot answer, so it is reported unproven and left alone."""
    key = buy_key(prefix, ["sku-far"])
    hold(client, key, "far-task")
    done = run("reap", "--watch", "0.3")
    assert done.returncode == 0, done.stderr
    assert f"unproven {key} task far-task: watched" in done.stdout, done.stdout
    assert "no worker answered inspect" in done.stdout
    assert "nothing to reap (1 unproven)" in done.stdout
    assert client.get(key) is not None


def test_a_renewed_hold_is_never_reaped(run: Run, client: redis.Redis, prefix: str) -> None:
    """A hold whose lease is being renewed (a live holder) stays, whatever the workers say."""
    key = buy_key(prefix, ["sku-live"])
    live = RedisLock(client, key, timeout=1.2, auto_renew=True,
                     holder_info={"task_id": "live-task", "task": TASK})  # fmt: skip
    assert live.acquire(blocking=False)
    done = run("reap", "--watch", "1.0")
    assert done.returncode == 0, done.stderr
    assert "nothing to reap" in done.stdout
    assert live.owned()
    live.release()


def test_a_queued_hold_stays_while_its_message_is_in_the_broker(
    run: Run, client: redis.Redis, prefix: str
) -> None:
    """A hold taken at publish stays while a message with its task id waits in the broker
    queue; once the message is gone, it is reaped as "in no queue"."""
    key = buy_key(prefix, ["sku-q"])
    hold(client, key, "queued-task", queued=True)
    queue = f"celery-{prefix}"
    client.rpush("celery", json.dumps({"headers": {"id": "queued-task"}, "queue": queue}))
    try:
        kept = run("reap", "--watch", "0.2")
        assert "nothing to reap" in kept.stdout, kept.stdout + kept.stderr
        assert client.get(key) is not None
    finally:
        client.lrem("celery", 0, json.dumps({"headers": {"id": "queued-task"}, "queue": queue}))
    freed = run("reap", "--watch", "0.2")
    assert f"freed {key} task queued-task: taken at publish, but its message is in no queue" in (
        freed.stdout
    )


def test_list_shows_state_waiters_and_the_follow_up(
    run: Run, client: redis.Redis, prefix: str
) -> None:
    """``locks list --json`` gives each holder's state and age, the waiters in the order they
    came (their task ids) and the pending follow-up."""
    key = buy_key(prefix, ["sku-w"])
    holder = hold(client, key, "holder-task")
    waiters = []
    for index in range(2):
        waiter = RedisLock(client, key, timeout=30, fallback_poll=5,
                           holder_info={"task_id": f"waiter-{index}", "task": TASK})  # fmt: skip
        # They wait until the end of the test: two CLI runs may take a while on a busy machine.
        thread = threading.Thread(target=waiter.acquire, kwargs={"timeout": 60})
        thread.start()
        waiters.append((waiter, thread))
        time.sleep(0.2)
    client.hset(companion_key(key, "pending"), "id", "next-task")
    done = run("list", "--json")
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = next(row for row in json.loads(done.stdout) if row["key"] == key)
    assert found["state"] == "running"
    assert found["age"] is not None
    assert found["waiters"] == ["waiter-0", "waiter-1"]
    assert found["pending"] == "next-task"
    table = run("list")
    assert "waiter-0, waiter-1" in table.stdout
    assert "next-task" in table.stdout
    holder.release()
    for waiter, thread in waiters:
        thread.join(10)
        if waiter.owned():
            waiter.release()
