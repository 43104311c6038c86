"""A real celery beat every second for a three-second job: no overlap, no pile-up."""

from __future__ import annotations

import itertools
import time
from types import ModuleType
from typing import Any

import pytest
import redis

from tests.worker.conftest import wait_for
from tests.worker.test_policies import _runs

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("beat_app", "name"),
    [("tests.worker.proj", "beat"), ("tests.worker.beat_byname", "byname")],
    ids=["beat-imports-task", "beat-by-name"],
)
def test_beat_ticks_never_overlap_nor_pile_up(
    proj: ModuleType, data: redis.Redis, workers: Any, beat_app: str, name: str
) -> None:
    """Over 9 s of 1 s ticks for a 3 s queue-scope job, runs never overlap, at most
    ceil(9/3)+2 bodies run (one per 3 s, not one per tick), and the queue does not grow
    (duplicates publish nothing, or are skipped at run time when beat only knows the task
    by name)."""
    workers(concurrency=2)
    workers.beat(beat_app)
    assert wait_for(lambda: data.llen(f"events:{name}") >= 1, timeout=30)  # beat is up
    time.sleep(9.0)
    backlog = data.llen("csl-tests")
    runs = _runs(data, name)
    assert len(runs) >= 2, data.lrange(f"events:{name}", 0, -1)
    assert len(runs) <= 5
    assert data.get(f"overlaps:{name}") is None
    for (_, end), (start, _) in itertools.pairwise(runs):
        assert start >= end
    assert backlog <= 2
