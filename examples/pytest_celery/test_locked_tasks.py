"""Locked tasks in pytest-celery's container setup (``celery_setup``): run with a Docker
engine, ``pytest examples/pytest_celery``."""

from __future__ import annotations

import time

from pytest_celery import CeleryTestSetup

from celery_singleton_lock import skip_info
from celery_singleton_lock.pytest_plugin import SingletonLocks
from examples.pytest_celery.tasks import build_report


def test_a_duplicate_is_skipped_while_the_first_runs(celery_setup: CeleryTestSetup) -> None:
    """While one build of a report runs in the worker container, a second build of the same
    report is skipped (result None, visible with skip_info); the lock is free afterwards."""
    queue = celery_setup.worker.worker_queue
    locks = SingletonLocks.for_app(celery_setup.app)
    key = build_report.lock_key("r-1", 0)

    first = build_report.s("r-1", 3).apply_async(queue=queue)
    locks.assert_held(key, task_id=first.id, timeout=30)
    duplicate = build_report.s("r-1", 0).apply_async(queue=queue)

    assert duplicate.get(timeout=30) is None
    skip = skip_info(duplicate, app=celery_setup.app)
    assert skip is not None
    assert skip.holder_task_id == first.id
    assert first.get(timeout=30) == "report r-1 built"
    locks.assert_free(key)


def test_other_reports_run_side_by_side(celery_setup: CeleryTestSetup) -> None:
    """Builds of different reports do not wait for each other."""
    queue = celery_setup.worker.worker_queue
    started = time.monotonic()
    results = [build_report.s(f"r-{n}", 1).apply_async(queue=queue) for n in range(2)]
    assert [result.get(timeout=30) for result in results] == [
        "report r-0 built",
        "report r-1 built",
    ]
    assert time.monotonic() - started < 20
