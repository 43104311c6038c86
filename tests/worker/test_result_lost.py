"""A late copy of a message whose run finished (queue scope, ordered park) never runs again;
when the first run's result was never stored (its worker died between the end of the run
and storing the result), the copy stores ``ResultLost`` so that the call still ends in a
visible state, not ``PENDING`` for ever; when it was stored, it stands."""

from __future__ import annotations

import importlib
import os
import uuid
from collections.abc import Callable
from types import ModuleType

import pytest
import redis

from celery_singleton_lock import ResultLost
from celery_singleton_lock.engine.keyspace import DONE, companion_key
from celery_singleton_lock.testing import CeleryWorker, RedisServer
from tests.worker.conftest import wait_for

pytestmark = pytest.mark.slow

APP = "tests.worker.keep_proj"


@pytest.fixture(scope="module")
def keep(worker_redis: RedisServer) -> ModuleType:
    os.environ["CSL_BROKER_URL"] = worker_redis.url
    os.environ["CSL_BACKEND_URL"] = worker_redis.url.replace("/0", "/1")
    return importlib.import_module(APP)


def _finished_without_result(keep: ModuleType, data: redis.Redis, name: str) -> str:
    """A task id recorded as finished under its key (as a run that ended does), with no
    result stored: what a worker killed right after the release leaves."""
    task_id = uuid.uuid4().hex
    key = keep.queued_once.lock_key(name, 1)
    data.zadd(companion_key(key, DONE), {task_id: 1})
    return task_id


def test_a_late_copy_whose_result_was_lost_stores_result_lost(
    keep: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker]
) -> None:
    workers(concurrency=2, app=APP)
    task_id = _finished_without_result(keep, data, "lost-1")
    copy = keep.app.send_task(keep.queued_once.name, ("lost-1", 1), task_id=task_id)
    with pytest.raises(ResultLost):
        copy.get(timeout=20)
    assert data.llen("runs:lost-1") == 0  # the body did not run again


def test_a_late_copy_leaves_a_stored_result_as_it_is(
    keep: ModuleType, data: redis.Redis, workers: Callable[..., CeleryWorker]
) -> None:
    worker = workers(concurrency=2, app=APP)
    task_id = _finished_without_result(keep, data, "kept-1")
    keep.queued_once.backend.store_result(task_id, 41, "SUCCESS")
    copy = keep.app.send_task(keep.queued_once.name, ("kept-1", 1), task_id=task_id)
    assert wait_for(lambda: "not run again" in worker.log(), timeout=20)
    assert copy.get(timeout=30) == 41
    assert data.llen("runs:kept-1") == 0
