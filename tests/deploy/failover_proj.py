"""The Celery app of the Sentinel failover test: its worker locks through three Sentinels.

``CSL_FAILOVER_BROKER`` is the broker (and where results and the sequence live: a plain
private redis-server that is never failed over); ``CSL_FAILOVER_LOCK`` the lock URL
(``sentinel://…?master_name=mymaster``).
"""

from __future__ import annotations

import math
import os

import redis
from celery import Celery

from celery_singleton_lock import LockedTask, current_lock

BROKER = os.environ.get("CSL_FAILOVER_BROKER", "redis://127.0.0.1:6399/0")

app = Celery("failover", broker=BROKER, backend=BROKER.replace("/0", "/1"), set_as_current=False)
app.conf.update(
    singleton_lock_url=os.environ.get("CSL_FAILOVER_LOCK") or None,
    singleton_lock_timeout=3.0,
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    task_default_queue="csl-failover",
    result_backend_transport_options={"retry_policy": {"max_retries": 2, "interval_max": 0.2}},
)


@app.task(
    base=LockedTask, lock_keys=["key"], lock_on_conflict="wait", lock_wait=math.inf,
    max_retries=None, shared=False,
)  # fmt: skip
def bump(key: str) -> list[int]:
    """Read, increment, write back a counter of ``key``; returns [number, fencing token]."""
    data = redis.Redis.from_url(BROKER.replace("/0", "/2"))
    number = int(data.get(f"seq:{key}") or 0) + 1
    data.set(f"seq:{key}", number)
    lock = current_lock()
    return [number, lock.fencing_token if lock and lock.fencing_token else -1]
