"""The holder info a run's or a publish's lock stores comes from a per-process template:
it must be exactly the JSON the long way writes, for any task id."""

from __future__ import annotations

import pytest
from celery import Celery

from celery_singleton_lock import LockedTask
from celery_singleton_lock.runtime.locking import locking_for


@pytest.mark.parametrize("task_id", ["0f6c2d8e-1d7b-4a52", 'we"ird\\id', "ü-ñ\x00"])
@pytest.mark.parametrize("queued", [False, True])
def test_the_template_gives_the_same_text_as_the_long_way(task_id: str, queued: bool) -> None:
    app = Celery("holder-info", set_as_current=False)
    app.conf.singleton_lock_url = "redis://127.0.0.1:1/0"  # never connected

    @app.task(base=LockedTask, shared=False, name="holder_info.job")
    def job(n: int) -> int:
        return n

    locking = locking_for(app.tasks[job.name])
    assert locking is not None
    assert locking._fast_info(task_id, queued=queued) == locking._info(task_id, queued=queued)
