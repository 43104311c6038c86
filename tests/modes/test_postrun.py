"""``task_postrun`` is the last word on a run's hold: a run interrupted after it took its
key and before its body's own release (a soft time limit lands anywhere) is released there.
On the session's private redis-server, through Celery's real signal."""

from __future__ import annotations

import uuid
from typing import Any

import redis
from celery import Celery, states
from celery import signals as celery_signals
from celery.app.task import Context

from celery_singleton_lock import LockedTask
from celery_singleton_lock.runtime.run import before_body, resolve
from celery_singleton_lock.testing import RedisServer


def _app(url: str) -> Any:
    app = Celery("postrun", broker="memory://", set_as_current=False)
    app.conf.update(singleton_lock_url=url, singleton_lock_prefix=f"pr{uuid.uuid4().hex[:8]}")

    @app.task(name="postrun.job", base=LockedTask, shared=False)
    def job(n: int) -> int:
        return n

    return app.tasks[job.name]


def _start(task: Any, n: int) -> tuple[str, Any]:
    """Push a worker-like request for a call of ``task`` and take its lock as a delivery
    does, stopping just before the body."""
    task_id = str(uuid.uuid4())
    task.request_stack.push(
        Context(id=task_id, is_eager=False, called_directly=False, hostname="t@localhost")
    )
    run = resolve(task, task.request, (n,), {}, task.run)
    assert run is not None
    before_body(run)
    return task_id, run


def test_a_run_interrupted_before_its_body_is_released_by_task_postrun(
    redis_server: RedisServer,
) -> None:
    task = _app(redis_server.url)
    client = redis.Redis.from_url(redis_server.url)
    task_id, run = _start(task, 1)
    try:
        assert run.holding
        assert client.exists(run.key) == 1
        celery_signals.task_postrun.send(sender=task, task_id=task_id, state=states.FAILURE)
        assert client.exists(run.key) == 0
        assert not run.holding
    finally:
        task.request_stack.pop()
