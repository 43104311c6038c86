"""The Celery project behind the ``celery locks`` samples of docs/operations.md.

``CSL_DOCS_URL`` is the broker and the lock Redis (a server of the sample's own);
``CSL_DOCS_LOCK_URL``, when set, is the lock Redis instead (an ACL user of that server).
The task bodies never run: the samples take the locks themselves, or publish to a queue
nobody consumes. The tasks are not shared: importing this module adds them to this app only.
"""

from __future__ import annotations

import os

from celery import Celery

from celery_singleton_lock import LockedTask

URL = os.environ.get("CSL_DOCS_URL", "redis://127.0.0.1:6399/0")

app = Celery("proj", broker=URL)
app.conf.update(
    singleton_lock_url=os.environ.get("CSL_DOCS_LOCK_URL") or URL,
    task_default_queue="docs-samples",
)


@app.task(
    name="shop.buy", shared=False, base=LockedTask, lock_keys=["sku"], lock_on_conflict="wait"
)
def buy(sku: str, user_id: int) -> None:
    """One purchase of ``sku``: purchases of one SKU take turns."""


@app.task(
    name="shop.nightly_report",
    shared=False,
    base=LockedTask,
    lock_keys=[],
    lock_scope="queue",
    lock_on_conflict="coalesce",
)
def nightly_report(day: str) -> None:
    """Queued or running once; calls meanwhile become one follow-up with the latest day."""


@app.task(
    name="shop.export",
    shared=False,
    base=LockedTask,
    lock_keys=["customer_id"],
    lock_limit=2,
    lock_on_conflict="wait",
)
def export(customer_id: int, report: str) -> None:
    """At most two exports per customer at a time."""
