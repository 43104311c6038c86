"""Gapless per-tenant invoice numbers in SQLite, allocated as "read max, add one, write".

Why not Redis ``INCR``? Because the number must be gapless *in the database*: an ``INCR``
that succeeds before an insert that fails leaves a hole, and the numbers come from the
invoices table itself. Read-max-plus-one is only correct when allocations for a tenant run
one at a time, so :func:`issue_invoice` is a ``LockedTask`` keyed on the tenant that waits
for its turn.

A lock with a lease has one weakness left: a holder that stalls (a GC pause, a frozen VM)
past its lease no longer holds the lock but does not know it, and may write late. The
fencing token closes that hole. Each hold gets a token larger than every earlier one; the
allocation first *claims* the tenant in the database with its token (refused if a later
token already claimed it) and its insert only lands while its token is still the claimed
one. A stale holder's late write is therefore rejected by the database, whatever the lock
says by then.

Configured from the environment so the script and its workers agree: ``REDIS_URL``
(broker, locks, results), ``GLOBAL_ID_NAMESPACE`` (queue and key prefix, default
``global_id``), ``GLOBAL_ID_DB`` (the SQLite file, default ``invoices.sqlite3``).
"""

from __future__ import annotations

import os
import sqlite3
import time
from typing import Any

from celery import Celery

from celery_singleton_lock import LockedTask, RedisLock, current_lock

REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
NAMESPACE = os.environ.get("GLOBAL_ID_NAMESPACE", "global_id")
DB_PATH = os.environ.get("GLOBAL_ID_DB", "invoices.sqlite3")
#: The lock's lease in seconds (renewed while an allocation runs).
LEASE = 2.0
#: The time between reading the max and inserting (rendering the PDF, say).
WORK_SECONDS = 0.01

app = Celery("global_id")
app.conf.update(
    broker_url=REDIS_URL,
    broker_transport_options={"global_keyprefix": f"{NAMESPACE}:"},
    broker_connection_retry_on_startup=True,
    result_backend=REDIS_URL,
    result_backend_transport_options={"global_keyprefix": f"{NAMESPACE}:"},
    result_expires=3600,
    task_default_queue=NAMESPACE,
    worker_prefetch_multiplier=1,
    worker_enable_remote_control=False,
    singleton_lock_url=REDIS_URL,
    singleton_lock_prefix=f"{NAMESPACE}:lock",
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS invoices (
    tenant TEXT NOT NULL,
    number INTEGER NOT NULL,
    ref TEXT NOT NULL,
    fence INTEGER NOT NULL,            -- token of the lock hold that wrote the row
    PRIMARY KEY (tenant, number)
);
CREATE TABLE IF NOT EXISTS tenant_fences (
    tenant TEXT PRIMARY KEY,
    fence INTEGER NOT NULL             -- the latest token that claimed the tenant
);
"""


class StaleFence(Exception):
    """The database has seen a later fencing token for this tenant: this holder is stale."""


def connect(path: str = DB_PATH) -> sqlite3.Connection:
    """A connection in autocommit mode: each statement is its own transaction, as with
    most ORMs, so read-max-plus-one is *not* protected by the database."""
    db = sqlite3.connect(path, timeout=30, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    return db


def create_schema(path: str = DB_PATH) -> None:
    """Create the tables (idempotent)."""
    db = connect(path)
    try:
        db.executescript(SCHEMA)
    finally:
        db.close()


def claim(db: sqlite3.Connection, tenant: str, fence: int) -> None:
    """Record that the holder with ``fence`` is now in charge of ``tenant``; StaleFence if
    a later holder already is. One statement, so it is atomic."""
    cursor = db.execute(
        "INSERT INTO tenant_fences (tenant, fence) VALUES (?, ?) "
        "ON CONFLICT (tenant) DO UPDATE SET fence = excluded.fence "
        "WHERE excluded.fence >= tenant_fences.fence",
        (tenant, fence),
    )
    if cursor.rowcount == 0:
        raise StaleFence(f"{tenant}: fence {fence} is older than the one already claimed")


def claimed_fence(db: sqlite3.Connection, tenant: str) -> int | None:
    """The latest fencing token that claimed ``tenant``."""
    row = db.execute("SELECT fence FROM tenant_fences WHERE tenant = ?", (tenant,)).fetchone()
    return int(row[0]) if row else None


def next_number(db: sqlite3.Connection, tenant: str) -> int:
    """Read max plus one: the step that must not run twice at once for a tenant."""
    row = db.execute(
        "SELECT COALESCE(MAX(number), 0) + 1 FROM invoices WHERE tenant = ?", (tenant,)
    ).fetchone()
    return int(row[0])


def insert(db: sqlite3.Connection, tenant: str, number: int, ref: str, fence: int) -> None:
    """Insert the invoice only while ``fence`` is still the tenant's claimed token (one
    statement: the check and the write cannot be separated); StaleFence otherwise."""
    cursor = db.execute(
        "INSERT INTO invoices (tenant, number, ref, fence) SELECT ?, ?, ?, ? "
        "WHERE (SELECT fence FROM tenant_fences WHERE tenant = ?) = ?",
        (tenant, number, ref, fence, tenant, fence),
    )
    if cursor.rowcount == 0:
        raise StaleFence(f"{tenant}: write of number {number} with stale fence {fence} refused")


def freeze(lock: RedisLock, db: sqlite3.Connection, tenant: str, fence: int) -> float:
    """Play a stalled holder: stop renewing the lease (a frozen process cannot renew
    either) and stay silent until a later holder has claimed the tenant (at most 30 s).
    Returns the seconds frozen."""
    began = time.monotonic()
    lock.detach()  # renewals stop; the lease runs out as it would for a frozen process
    while time.monotonic() - began < 30 and claimed_fence(db, tenant) == fence:
        time.sleep(0.05)
    return time.monotonic() - began


@app.task(
    base=LockedTask, lock_keys=["tenant"], lock_on_conflict="wait", lock_timeout=LEASE,
    lock_wait=60,
)  # fmt: skip
def issue_invoice(tenant: str, ref: str, stall: bool = False) -> dict[str, Any]:
    """Give the invoice ``ref`` the tenant's next number; ``stall`` plays a holder that
    freezes between reading the number and writing it (to show the fence at work)."""
    lock = current_lock()
    if lock is None or lock.fencing_token is None:
        raise RuntimeError("issue_invoice must run as a task, under its lock")
    fence = lock.fencing_token
    db = connect()
    try:
        claim(db, tenant, fence)
        number = next_number(db, tenant)
        time.sleep(WORK_SECONDS)
        frozen = freeze(lock, db, tenant, fence) if stall else 0.0
        outcome = {"tenant": tenant, "ref": ref, "number": number, "fence": fence}
        try:
            insert(db, tenant, number, ref, fence)
        except StaleFence as exc:
            return {**outcome, "written": False, "frozen": frozen, "reason": str(exc)}
        return {**outcome, "written": True, "frozen": frozen}
    finally:
        db.close()
