"""The lock for asyncio code: ``AsyncRedisLock`` on a ``redis.asyncio`` client.

``RedisLock``'s API with ``await`` and ``async with``, on the same scripts, values and keys,
so both engines exclude each other on one key (see :mod:`.engine.aio`). Imports nothing
from Celery::

    from celery_singleton_lock.aio import AsyncRedisLock

    async with AsyncRedisLock(client, "orders:{sku-42}", timeout=5.0) as held:
        ...
"""

from __future__ import annotations

from celery_singleton_lock.engine.aio import DEFAULT_CALL_TIMEOUT, AsyncRedisLock

__all__ = ["DEFAULT_CALL_TIMEOUT", "AsyncRedisLock"]
