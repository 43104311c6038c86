"""A beat that knows the job only by its name: it never imports the task module.

    celery -A examples.beat_dedup.beat_by_name beat

Beat publishes every tick with ``send_task``; the lock cannot be taken at publish time,
so the worker's run-time check (``refresh_report_by_name`` is a run-scope ``LockedTask``
with the default ``skip``) makes the ticks that arrive during a run no-ops.
"""

from __future__ import annotations

from celery import Celery

from examples.beat_dedup.config import EVERY, celery_settings

app = Celery("beat_dedup_by_name")
app.conf.update(
    celery_settings(),
    beat_schedule={
        "refresh-report-by-name": {
            "task": "examples.beat_dedup.tasks.refresh_report_by_name",  # a name, not an import
            "schedule": EVERY,
        }
    },
)
