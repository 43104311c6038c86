"""The lock belongs to one delivery of a message: a second delivery of the same task id
(a broker redelivery, or the id published twice) never runs beside the first, and once
the first finished it does not run the work again."""

from __future__ import annotations

import time
import uuid
from types import ModuleType
from typing import Any

import pytest
import redis

from tests.worker.conftest import wait_for

pytestmark = pytest.mark.slow

TASK = "tests.worker.proj.late_queued"


def test_same_task_id_published_twice_runs_once(
    proj: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """apply_async twice with one explicit task id: the second publishes nothing."""
    workers(concurrency=2)
    task_id = str(uuid.uuid4())
    first = proj.late_queued.apply_async(("twice", 1.5), task_id=task_id)
    second = proj.late_queued.apply_async(("twice", 1.5), task_id=task_id)
    assert second.id == first.id == task_id
    assert first.get(timeout=30) == "ran"
    time.sleep(1.0)
    assert data.get("runs:twice") == "1"
    # published again with that id after it finished: still not run again
    again = proj.late_queued.apply_async(("twice", 0.1), task_id=task_id)
    assert again.id == task_id
    time.sleep(1.5)
    assert data.get("runs:twice") == "1"


def test_same_task_id_sent_twice_by_name_never_overlaps(
    proj: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """Two messages with one task id (send_task, no producer lock): the second delivery
    is a rival of the first, not the same owner; it does not run the work again."""
    worker = workers(concurrency=2)
    task_id = str(uuid.uuid4())
    for _ in range(2):
        proj.app.send_task(TASK, ("byname", 2.0), task_id=task_id)
    assert wait_for(lambda: data.llen("events:byname") >= 2, timeout=30)  # first ended
    assert wait_for(lambda: "not run again" in worker.log(), timeout=20)
    assert worker.log().count(f"late_queued[{task_id}] received") >= 2
    assert data.get("overlaps:byname") is None
    assert data.get("runs:byname") == "1"


def test_a_second_delivery_that_comes_back_later_leaves_the_state_to_the_first(
    proj: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """Two messages with one task id; the second is delivered while the first runs, and is
    published to come back later. The task id's state is the first delivery's: the second
    stores no RETRY (one stored after the first's SUCCESS stayed for ever when the second
    then came back as a late copy that runs nothing)."""
    worker = workers(concurrency=2)
    task_id = str(uuid.uuid4())
    proj.app.send_task(TASK, ("state", 3.0), task_id=task_id)
    assert wait_for(lambda: data.get("runs:state") == "1", timeout=30)  # the first runs
    proj.app.send_task(TASK, ("state", 3.0), task_id=task_id)
    assert wait_for(lambda: worker.log().count(f"late_queued[{task_id}] received") >= 2, 30)
    ended = (f"late_queued[{task_id}] ignored", f"late_queued[{task_id}] retry:")
    assert wait_for(lambda: any(line in worker.log() for line in ended), timeout=30)
    result = proj.app.AsyncResult(task_id)
    assert result.state != "RETRY"  # the first still runs (3 s): its state, not a RETRY
    assert result.get(timeout=30) == "ran"
    assert wait_for(lambda: "not run again" in worker.log(), timeout=30)
    assert proj.app.AsyncResult(task_id).state == "SUCCESS"
    assert data.get("runs:state") == "1"
