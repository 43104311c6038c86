import os

import redis
from celery import Celery

from celery_singleton_lock import LockedTask, current_lock

REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
app = Celery("shop", broker=REDIS_URL, backend=REDIS_URL)  # backend: for .get()
store = redis.Redis.from_url(REDIS_URL)  # the stock, shared by every worker


@app.task(base=LockedTask, lock_keys=["sku"], lock_on_conflict="wait", lock_timeout=10)
def buy(sku: str, user_id: int) -> int | None:
    """Read, check, write back: safe, because purchases of one SKU take turns."""
    stock = int(store.get(f"stock:{sku}") or 0)
    if stock <= 0:
        return None
    store.set(f"stock:{sku}", stock - 1)
    lock = current_lock()  # None when called directly, outside a task run
    return lock.fencing_token if lock else 0
