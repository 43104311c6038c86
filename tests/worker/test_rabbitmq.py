"""The flash sale with a RabbitMQ broker and the lock on a separate Redis."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
import redis

from celery_singleton_lock.testing import RedisServer
from tests.worker.conftest import wait_for
from tests.worker.rabbit import RabbitServer

pytestmark = pytest.mark.slow


def test_flash_sale_on_a_rabbitmq_broker(
    proj: ModuleType, data: redis.Redis, workers: Any, worker_redis: RedisServer
) -> None:
    """Stock 20, 80 purchases through a private RabbitMQ node on 2 workers, lock Redis
    separate from the broker: exactly 20 sold and no overlap."""
    rabbit = RabbitServer().start()
    started = []
    try:
        env = {"CSL_BROKER_URL": rabbit.url, "CSL_LOCK_URL": worker_redis.url,
               "CSL_DATA_URL": worker_redis.url}  # fmt: skip
        started.append(workers(concurrency=2, extra_env=env))
        started.append(workers(concurrency=2, extra_env=env))
        data.set("stock:sku-r", 20)
        with proj.app.connection_for_write(rabbit.url) as conn:
            results = [proj.buy.apply_async(("sku-r", n), connection=conn) for n in range(80)]
        assert wait_for(lambda: all(r.ready() for r in results), timeout=120)
        assert sum(bool(r.result) for r in results) == 20
        assert int(data.get("stock:sku-r")) == 0
        assert data.get("overlaps:sku-r") is None
    finally:
        for worker in started:  # a warm shutdown while their broker still answers
            worker.stop()
        rabbit.stop()
