"""A tiny Celery app for the tests of ``celery_singleton_lock.testing``'s worker helper.

It configures no broker: the worker gets one only through ``CeleryWorker(broker_url=...)``.
The result backend comes from ``CSL_TINY_BACKEND``.
"""

from __future__ import annotations

import os

from celery import Celery

from celery_singleton_lock import LockedTask

app = Celery("tiny", backend=os.environ.get("CSL_TINY_BACKEND") or None)
app.conf.update(task_default_queue="tiny", broker_connection_retry_on_startup=True)


@app.task(base=LockedTask, name="tiny.double", lock_keys=["x"])
def double(x: int) -> int:
    """Twice ``x``, under the lock of ``x``."""
    return 2 * x
