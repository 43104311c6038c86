"""The Celery app the ``celery locks explain`` tests run the real CLI against, with a task
per mode whose state the command explains.

Configured from the environment as ``cliproj`` is: ``CSL_CLI_URL`` is the broker and the
lock Redis, ``CSL_CLI_PREFIX`` the lock prefix (each test uses its own on the shared
server); messages go to the queue ``<prefix>-queue``, which the tests' ``prefix`` fixture
deletes with the locks. No worker runs: the bodies never run.
"""

from __future__ import annotations

import os

from celery import Celery

from celery_singleton_lock import LockedTask

URL = os.environ.get("CSL_CLI_URL", "redis://127.0.0.1:6399/0")
PREFIX = os.environ.get("CSL_CLI_PREFIX", "csl")

app = Celery("explainproj", broker=URL)
app.conf.update(
    singleton_lock_url=URL,
    singleton_lock_prefix=PREFIX,
    task_default_queue=f"{PREFIX}-queue",
)


@app.task(
    shared=False,
    name="shop.buy",
    base=LockedTask,
    lock_keys=["sku"],
    lock_on_conflict="wait",
    lock_timeout=600.0,
)
def buy(sku: str, user_id: int) -> None:
    """Purchases of one SKU take turns."""


@app.task(
    shared=False,
    name="shop.report",
    base=LockedTask,
    lock_keys=[],
    lock_scope="queue",
    lock_on_conflict="coalesce",
)
def report(day: str) -> None:
    """Queued or running once; calls meanwhile become one follow-up."""


@app.task(
    shared=False,
    name="shop.restock",
    base=LockedTask,
    lock_keys=["sku"],
    lock_scope="queue",
    lock_on_conflict="park",
)
def restock(sku: str, count: int) -> None:
    """Queue scope, park: a call whose key is held parks at publish."""


@app.task(
    shared=False, name="shop.reindex", base=LockedTask, lock_keys=["shop"], lock_debounce=30.0
)
def reindex(shop: str) -> None:
    """Calls closer than 30 s apart run once, 30 s after the last."""


@app.task(
    shared=False, name="shop.sync", base=LockedTask, lock_keys=["account"], lock_rate_limit="2/m"
)
def sync(account: str) -> None:
    """At most two starts a minute per account."""


@app.task(shared=False, name="shop.export", base=LockedTask, lock_keys=["customer"], lock_limit=3)
def export(customer: int) -> None:
    """Up to three exports per customer at once."""


def _rows_weight(tenant: str, rows: int) -> int:
    """A weight callable that fails for some calls: 10 // rows (rows 0 divides by zero)."""
    return 10 // rows


@app.task(
    shared=False,
    name="shop.bulk",
    base=LockedTask,
    lock_keys=["tenant", "rows"],
    lock_limits=[("bulk:{tenant}", 4)],
    lock_weight=_rows_weight,
)
def bulk(tenant: str, rows: int) -> None:
    """Bulk imports share four units per tenant, each weighing 10 // rows."""


@app.task(shared=False, name="shop.ping")
def ping() -> None:
    """A task that is not locked."""
