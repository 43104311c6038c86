"""A publish made while another thread is still binding the task (Celery marks a task
bound before it gives it its request stack) must not fail reading the task's request."""

from __future__ import annotations

from celery import Celery

from celery_singleton_lock import LockedTask
from celery_singleton_lock.runtime.publish import _request_of


def test_a_task_without_its_request_stack_yet_has_no_current_request() -> None:
    app = Celery("bindrace", broker="memory://", set_as_current=False)

    @app.task(base=LockedTask, lock_keys=["n"], lock_scope="queue", shared=False)
    def job(n: int) -> int:
        return n

    request = job.request  # binds the task
    kind = type(job._get_current_object())  # type: ignore[attr-defined]
    assert _request_of(job) is request
    stack, kind.request_stack = kind.request_stack, None  # as mid-bind in another thread
    try:
        assert _request_of(job) is None
    finally:
        kind.request_stack = stack
