"""Locked tasks for the pytest-celery container example.

pytest-celery copies this module into the worker container (its "tasks injection"), where
the worker's app finds the tasks as shared tasks; the test process calls the same tasks on
its own app. Both sides take their locks on the broker's Redis (the default lock URL).
"""

from __future__ import annotations

import time

from celery import shared_task

from celery_singleton_lock import LockedTask


@shared_task(name="example.build_report", base=LockedTask, lock_keys=["report_id"])
def build_report(report_id: str, seconds: float) -> str:
    """At most one build per report at a time; a duplicate meanwhile is skipped."""
    time.sleep(seconds)
    return f"report {report_id} built"
