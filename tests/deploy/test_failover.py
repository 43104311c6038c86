"""A Sentinel failover (master, replica, three Sentinels, all real) under the lock.

Workers reconnect through Sentinel and keep going. Replication is asynchronous, so a lock
the master granted but had not yet sent to its replica is lost when that replica is
promoted; ``replicas=1`` (Redis ``WAIT``) refuses to grant what the replica did not
acknowledge, and fencing tokens issued by the new master still exceed the lost holder's.
How often this happens in practice is measured by ``benchmarks/failover.py`` (figures in
docs/deployment.md).
"""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import redis

from benchmarks.sentinel import SentinelGroup
from celery_singleton_lock import LockBackendError, RedisLock
from celery_singleton_lock.client import client_from_url
from celery_singleton_lock.testing import CeleryWorker, RedisServer

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def broker() -> Iterator[RedisServer]:
    """The broker (never failed over)."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def failover_proj(broker: RedisServer, failover_group: SentinelGroup) -> ModuleType:
    """The failover test's Celery project, pointed at this test's servers."""
    os.environ["CSL_FAILOVER_BROKER"] = broker.url
    os.environ["CSL_FAILOVER_LOCK"] = failover_group.url
    return importlib.import_module("tests.deploy.failover_proj")  # one test imports it


def test_workers_keep_going_across_a_sentinel_failover(
    broker: RedisServer, failover_group: SentinelGroup, failover_proj: ModuleType, tmp_path: Path
) -> None:
    """Locked tasks run through Sentinel; the master is SIGKILLed mid-run; the Sentinels
    promote the replica; every task sent before, during and after completes (the worker
    fails closed during the outage and retries), the new master holds the locks after it,
    and its fencing tokens exceed the old master's."""
    # Exclusion itself is not asserted across the failover: replication is asynchronous.
    env = {
        "CSL_FAILOVER_BROKER": broker.url,
        "CSL_FAILOVER_LOCK": failover_group.url,
        "PYTHONPATH": str(ROOT),
    }
    with CeleryWorker(
        "tests.deploy.failover_proj", concurrency=2, env=env, cwd=ROOT,
        log_path=tmp_path / "worker.log", ready_timeout=120,
    ) as worker:  # fmt: skip
        before = [failover_proj.bump.delay(f"k{i % 2}") for i in range(10)]
        for result in before[:4]:
            result.get(timeout=30)
        old = failover_group.kill_master()
        during = [failover_proj.bump.delay(f"k{i % 2}") for i in range(6)]
        new = failover_group.wait_failover(old)
        after = [failover_proj.bump.delay(f"k{i % 2}") for i in range(10)]
        runs = [tuple(r.get(timeout=90)) for r in before + during + after]
        assert len(runs) == 26
        # Tokens the new master issues exceed every token of before the kill (one host, one
        # clock: across hosts this needs the servers' clocks in sync).
        assert min(fence for _, fence in runs[len(before) + len(during) :]) > max(
            fence for _, fence in runs[:4]
        )
        with redis.Redis(port=new, socket_timeout=5) as promoted:
            stats = promoted.info("commandstats")
        assert stats.get("cmdstat_evalsha", {}).get("calls", 0) > 0  # locks taken there
        assert "singleton lock unavailable" in worker.log()  # it failed closed meanwhile


@pytest.mark.parametrize("replicas", [0, 1])
def test_an_unreplicated_lock_is_lost_by_a_failover_unless_replicas_is_set(
    lagging_group: SentinelGroup, replicas: int
) -> None:
    """Replication stalled: with replicas=0 the master grants the lock, the failover
    loses it, and a rival takes it from the new master — with a larger fencing token, so
    a fenced resource refuses the first holder's writes; with replicas=1 the acquire is
    refused (LockBackendError) and nothing is granted that the failover could lose."""
    client = client_from_url(lagging_group.url)
    holder = RedisLock(client, "fo:unreplicated", timeout=30, replicas=replicas)
    lagging_group.links[0].stall()
    if replicas:
        with pytest.raises(LockBackendError, match="replicas acknowledged"):
            holder.acquire(blocking=False)
    else:
        assert holder.acquire(blocking=False)
    old = lagging_group.kill_master()
    lagging_group.links[0].cut()  # what the link still held never reaches the replica
    lagging_group.links[0].resume()
    new = lagging_group.wait_failover(old)
    with redis.Redis(port=new, socket_timeout=5) as promoted:
        assert promoted.get("fo:unreplicated") is None  # the promoted replica never had it
    rival = RedisLock(client_from_url(lagging_group.url), "fo:unreplicated", timeout=30)
    deadline = time.monotonic() + 60
    while True:
        try:
            got = rival.acquire(blocking=False)
            break
        except LockBackendError:  # the client is still finding the new master
            assert time.monotonic() < deadline
            time.sleep(0.2)
    assert got
    if not replicas:
        assert not holder.lease_lost  # the first holder still believes it holds the lock
        assert holder.fencing_token is not None
        assert (rival.fencing_token or 0) > holder.fencing_token
