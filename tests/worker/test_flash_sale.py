"""Flash sale and global sequence on real prefork workers: never oversold, never duplicated."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
import redis

from tests.worker.conftest import wait_for

pytestmark = pytest.mark.slow


def test_flash_sale_sells_exactly_the_stock(
    proj: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """Stock 30, 120 purchase tasks for one SKU on 2 workers × 2 processes: exactly 30 sold,
    stock never negative, and no two purchases of the SKU ever overlapped."""
    workers(concurrency=2)
    workers(concurrency=2)
    data.set("stock:sku-1", 30)
    results = [proj.buy.delay("sku-1", user) for user in range(120)]
    assert wait_for(lambda: all(r.ready() for r in results), timeout=120)
    assert all(r.successful() for r in results), [r.result for r in results if r.failed()][:3]
    assert sum(bool(r.result) for r in results) == 30
    assert data.llen("sold:sku-1") == 30
    assert int(data.get("stock:sku-1")) == 0
    assert data.get("overlaps:sku-1") is None


def test_global_sequence_hands_out_each_number_once(
    proj: ModuleType, data: redis.Redis, workers: Any
) -> None:
    """200 read-increment-write allocations give exactly 1..200, and the fencing tokens seen
    by the allocations increase in allocation order."""
    workers(concurrency=2)
    workers(concurrency=2)
    results = [proj.next_id.delay("tenant-a") for _ in range(200)]
    assert wait_for(lambda: all(r.ready() for r in results), timeout=120)
    ids = [int(x) for x in data.lrange("ids:tenant-a", 0, -1)]
    assert sorted(ids) == list(range(1, 201))
    fences = [int(x) for x in data.lrange("fences:tenant-a", 0, -1)]
    assert fences == sorted(fences)
    assert len(set(fences)) == 200
