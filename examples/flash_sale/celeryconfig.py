"""Celery settings of the flash-sale example, read from the environment so that the
producer and every worker (on any host) agree.

``REDIS_URL``
    the Redis used as broker, as lock store and for the shop's data
    (default ``redis://localhost:6379/0``; docker-compose sets ``redis://redis:6379/0``).
``FLASH_SALE_NAMESPACE``
    the queue name and the prefix of every key the example writes (default
    ``flash_sale``); the demo sets a unique one per run so a shared Redis stays clean.
"""

from __future__ import annotations

import os

REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
NAMESPACE = os.environ.get("FLASH_SALE_NAMESPACE", "flash_sale")

broker_url = REDIS_URL
broker_connection_retry_on_startup = True
# Celery's own keys in Redis (the queue and its bindings) go under the namespace too.
broker_transport_options = {"global_keyprefix": f"{NAMESPACE}:"}
task_default_queue = NAMESPACE
task_ignore_result = True  # purchases record their outcome in Redis themselves
worker_prefetch_multiplier = 1  # a worker process takes one order at a time
worker_enable_remote_control = False  # no pidbox keys left behind in a shared Redis

# celery-singleton-lock: the locks live in the same Redis, under the example's namespace.
singleton_lock_url = REDIS_URL
singleton_lock_prefix = f"{NAMESPACE}:lock"
singleton_lock_timeout = 10  # seconds of lease; renewed while a purchase runs
