"""Stacked limits on a real 3-master Redis Cluster: every key of a stack and the lock keys
of its runs share the application's hash tag, so the one script that takes a key and its
shares never meets CROSSSLOT, whichever node the tag lands on; a task's keys agree."""

from __future__ import annotations

import threading
import time

from redis.cluster import RedisCluster

from celery_singleton_lock import RedisLock
from celery_singleton_lock.engine.stack import Limit, Stack, stack_base
from celery_singleton_lock.keys import task_lock_key
from celery_singleton_lock.stacking import stack_tag


def _job(report: str, tenant: str) -> None:
    del report, tenant


def test_stack_on_a_cluster(cluster_client: RedisCluster) -> None:
    """For three application prefixes (tags on different nodes where the hash spreads them),
    runs of many reports and tenants take the key and both limits in one step; the limits
    hold under threads, and a release gives every share back."""
    for prefix in ("csl", "shop", "billing"):
        base = stack_base(prefix)
        tag = stack_tag(prefix)
        slot = cluster_client.keyslot(base + "limits")
        keys = [
            task_lock_key(prefix, "proj.export", _job, (f"r{i}", "t"), {}, ("report",), tag=tag)
            for i in range(30)
        ]
        assert {cluster_client.keyslot(key) for key in keys} == {slot}
        inside = {"n": 0, "peak": 0, "over": 0}
        guard = threading.Lock()

        def run(
            key: str,
            tenant: str,
            base: str = base,
            inside: dict[str, int] = inside,
            guard: threading.Lock = guard,
        ) -> None:
            stack = Stack(
                base, (Limit(f"tenant:{tenant}", "tenant:{tenant}", 2), Limit("all", "all", 3))
            )
            lock = RedisLock(cluster_client, key, timeout=10, stack=stack)
            assert lock.acquire(timeout=30)
            with guard:
                inside["n"] += 1
                inside["peak"] = max(inside["peak"], inside["n"])
                inside["over"] += inside["n"] > 3
            time.sleep(0.002)
            with guard:
                inside["n"] -= 1
            lock.release()

        threads = [
            threading.Thread(target=run, args=(key, f"t{index % 2}"))
            for index, key in enumerate(keys)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert inside["over"] == 0
        assert cluster_client.zcard(base + "limit:all") == 0
        assert cluster_client.zcard(base + "limit:tenant:t0") == 0
    nodes = {
        cluster_client.get_node_from_key(stack_base(p) + "limits").name
        for p in ("csl", "shop", "billing")
    }
    assert len(nodes) >= 2  # the tags really are on different nodes
