"""A beat that knows the periodic job only by name: it never imports tests.worker.proj,
so nothing is locked at publish time and the worker's run-time check does the work."""

from __future__ import annotations

import os

from celery import Celery

app = Celery("byname", broker=os.environ.get("CSL_BROKER_URL", "redis://127.0.0.1:6399/0"))
app.conf.update(
    task_default_queue=os.environ.get("CSL_QUEUE", "csl-tests"),
    beat_schedule={
        "dedup-by-name": {
            "task": "tests.worker.proj.beat_job",
            "schedule": 1.0,
            "args": ("byname",),
        }
    },
)
