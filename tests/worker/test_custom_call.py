"""A custom ``Task.__call__`` in the class hierarchy (Flask's app-context pattern, tracing,
DB sessions) still wraps the locked body, with the worker's request intact."""

from __future__ import annotations

import json
from types import ModuleType
from typing import Any

import pytest
import redis

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("task_name", ["traced_locked", "traced_config"])
def test_custom_call_wraps_the_locked_body(
    proj: ModuleType, data: redis.Redis, workers: Any, task_name: str
) -> None:
    workers(concurrency=2)
    task = getattr(proj, task_name)
    results = [task.delay(task_name) for _ in range(4)]
    ids = [result.get(timeout=30) for result in results]
    calls = [json.loads(item) for item in data.lrange(f"traced:{task_name}", 0, -1)]
    assert calls, "the body never ran"
    for call in calls:
        assert call["inside"], "the body ran outside the base class's __call__"
        assert call["locked"], "the body ran without its lock"
        assert call["task_id"] in ids, "the body saw a request without the task id"
    assert data.get(f"overlaps:traced-{task_name}") is None
