"""The flash sale's tasks: the same checkout with and without the lock.

A checkout reads the stock, spends a few milliseconds (a price lookup, a payment call…)
and writes the stock back minus one: a read-modify-write, not atomic. Two checkouts of one
SKU that interleave both see the same stock, and both sell.

* :func:`buy_unlocked` is a plain Celery task: it oversells under concurrency.
* :func:`buy` is the same body on :class:`~celery_singleton_lock.LockedTask` with
  ``lock_keys=["sku"]`` and ``lock_on_conflict="wait"``: checkouts of one SKU run one at a
  time (different SKUs still run in parallel), and it never oversells.

Besides the sale itself, each checkout records what the demo reports (``record_lock``
and the signal receivers at the bottom): how many orders finished or failed, whether two
checkouts of a SKU ever overlapped, whether ``buy`` found its SKU locked when it started,
how long it took to get the lock, and the fencing token it held. Drop those when you copy
the pattern.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery, signals

from celery_singleton_lock import LockedTask, current_lock
from examples.flash_sale.celeryconfig import NAMESPACE, REDIS_URL

#: Time between reading the stock and writing it back: the window in which an unlocked
#: checkout of the same SKU can slip in. A few milliseconds oversell reliably.
CHECKOUT_SECONDS = 0.005

app = Celery("flash_sale")
app.config_from_object("examples.flash_sale.celeryconfig")

#: ``FLASH_SALE_METRICS_PORT``: serve the lock metrics from every worker on this port, for
#: Prometheus (docker-compose.yml sets it; ``examples/grafana`` charts them). Needs the
#: ``metrics`` extra, and ``PROMETHEUS_MULTIPROC_DIR`` for the prefork pool (see
#: docs/observability.md); the directory is made here if missing.
METRICS_PORT = os.environ.get("FLASH_SALE_METRICS_PORT")
if METRICS_PORT:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):  # read when prometheus_client is imported
        os.makedirs(os.environ["PROMETHEUS_MULTIPROC_DIR"], exist_ok=True)
    from celery_singleton_lock import metrics  # only when asked for: it needs prometheus_client

    metrics.install(app, port=int(METRICS_PORT))


def key(phase: str, what: str, sku: str = "") -> str:
    """Where a phase keeps one of its numbers, e.g. ``flash_sale:locked:stock:sku-1``."""
    return f"{NAMESPACE}:{phase}:{what}" + (f":{sku}" if sku else "")


_client: redis.Redis | None = None
_client_pid = 0


def store() -> redis.Redis:
    """This process's client of the shop's Redis (a forked pool process makes its own)."""
    global _client, _client_pid  # noqa: PLW0603 - one lazily made client per process
    if _client is None or _client_pid != os.getpid():
        _client = redis.Redis.from_url(REDIS_URL, socket_timeout=10)
        _client_pid = os.getpid()
    return _client


def checkout(phase: str, sku: str) -> bool:
    """Sell one item of ``sku`` if the stock says there is one: read, think, write back."""
    r = store()
    if r.incr(key(phase, "inside", sku)) > 1:
        r.incr(key(phase, "overlaps"))  # another checkout of this SKU is between read and write
    try:
        stock = int(r.get(key(phase, "stock", sku)) or 0)
        time.sleep(CHECKOUT_SECONDS)
        if stock <= 0:
            return False
        r.set(key(phase, "stock", sku), stock - 1)
        r.incr(key(phase, "sold", sku))  # the sales ledger: one atomic INCR per item sold
        return True
    finally:
        r.decr(key(phase, "inside", sku))


@app.task
def buy_unlocked(sku: str, order_id: int) -> bool:
    """Checkout without a lock: concurrent purchases of one SKU oversell."""
    return checkout("unlocked", sku)


@app.task(base=LockedTask, lock_keys=["sku"], lock_on_conflict="wait", lock_wait=60)
def buy(sku: str, order_id: int) -> bool:
    """Checkout under a per-SKU lock: purchases of one SKU run one at a time."""
    record_lock("locked", sku)
    return checkout("locked", sku)


# -- what the demo measures ------------------------------------------------------------

PHASE_OF = {buy_unlocked.name: "unlocked", buy.name: "locked"}
_started: dict[str, float] = {}


def record_lock(phase: str, sku: str) -> None:
    """Note how long this run took to get its lock and the fencing token it got.

    The time runs from ``task_prerun`` (just before the lock is requested) to the start of
    the body; the tokens go to a per-SKU list in the order the checkouts ran.
    """
    task_id = buy.request.id
    began = _started.pop(task_id, None) if task_id else None
    lock = current_lock()
    r = store().pipeline(transaction=False)
    if began is not None:
        r.rpush(key(phase, "lock_ms"), f"{(time.perf_counter() - began) * 1000:.3f}")
    if lock is not None and lock.fencing_token is not None:
        r.rpush(key(phase, "fences", sku), lock.fencing_token)
    r.execute()


@signals.task_prerun.connect
def _before(
    task_id: str | None = None, task: Any = None, args: Any = None, kwargs: Any = None, **_: Any
) -> None:
    if not task_id or getattr(task, "name", None) not in PHASE_OF:
        return
    _started[task_id] = time.perf_counter()
    if task.name == buy.name:
        # The run is about to ask for its lock: if the key exists, another purchase of this
        # SKU holds it and this one will wait (a release in between is rare and harmless).
        lock_key = buy.lock_key(*(args or ()), **(kwargs or {}))
        if store().exists(lock_key):
            store().incr(key(PHASE_OF[buy.name], "waits"))


@signals.task_postrun.connect
def _after(
    task_id: str | None = None, task: Any = None, state: str | None = None, **_: Any
) -> None:
    phase = PHASE_OF.get(getattr(task, "name", ""))
    if phase is None:
        return
    if task_id:
        _started.pop(task_id, None)
    r = store().pipeline(transaction=False)
    if state != "SUCCESS":
        r.incr(key(phase, "failed"))
    r.incr(key(phase, "done"))
    r.execute()


@signals.task_failure.connect
def _failed(sender: Any = None, exception: BaseException | None = None, **_: Any) -> None:
    phase = PHASE_OF.get(getattr(sender, "name", ""))
    if phase is not None:
        r = store().pipeline(transaction=False)
        r.rpush(key(phase, "errors"), f"{type(exception).__name__}: {exception}"[:300])
        r.ltrim(key(phase, "errors"), 0, 19)
        r.execute()
