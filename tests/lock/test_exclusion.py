"""Mutual exclusion across real processes on a real redis-server."""

from __future__ import annotations

from celery_singleton_lock.testing import RedisServer
from tests.lock.hammer import run_hammer


def test_eight_processes_never_overlap_nor_lose_updates(
    redis_server: RedisServer, key: str, scripting: bool
) -> None:
    """8 processes × 25 non-atomic increments under the lock: no overlap, no lost update,
    and fencing tokens order the critical sections exactly as they happened."""
    result = run_hammer(redis_server.url, key, scripting=scripting)
    assert result.overlaps == 0
    assert result.counter == result.expected
    assert result.fences_increasing


def test_detectors_catch_a_broken_lock(redis_server: RedisServer, key: str) -> None:
    """The same harness with a lock that excludes nobody reports overlaps and lost updates,
    so the test above would fail against a broken lock."""
    result = run_hammer(redis_server.url, key, scripting=True, broken=True, iterations=15)
    assert result.overlaps > 0
    assert result.counter < result.expected
