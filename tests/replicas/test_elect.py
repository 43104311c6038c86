"""A beat replica whose election fails after it took the leader lease gives the lease back
and stands by (in process, against a real redis-server).

The failure is made certain, not timed: the failing replica's ACL user may not run
``PTTL``, which the election's read of the lease uses and nothing before it does (the
heartbeat and the acquire run scripts that never call it on a lease of ours)."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from celery import Celery

from celery_singleton_lock.beat import LeaderScheduler
from celery_singleton_lock.testing import RedisServer

pytestmark = pytest.mark.timeout(120)


def replica(url: str, schedule: Path) -> LeaderScheduler:
    """A replica of group ``elect`` with a 60 s lease (far longer than the test: a lease
    left held would still be held when the test looks)."""
    app = Celery("elect", set_as_current=False)
    app.conf.update(
        broker_url="redis://127.0.0.1:1/0",
        singleton_lock_url=url,
        singleton_beat_lease=60,
        beat_schedule={"job": {"task": "elect.job", "schedule": 30.0}},
    )
    return LeaderScheduler(app, schedule_filename=str(schedule), lazy=True)


def test_a_failed_election_gives_the_lease_back(tmp_path: Path) -> None:
    """The lock Redis fails between the acquire and the election's read: the replica does
    not lead, the lease is free at once (another replica leads on its next tick), and
    the failed replica can contend again (its next tick waits as a standby)."""
    with RedisServer() as server:
        admin = redis.Redis.from_url(server.url, socket_timeout=10)
        admin.acl_setuser(
            "no-pttl", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"],
            commands=["+@all", "-pttl"],
        )  # fmt: skip
        failing = replica(f"redis://no-pttl:pw@127.0.0.1:{server.port}/0", tmp_path / "a")
        other = replica(server.url, tmp_path / "b")
        try:
            failing.tick()
            assert not failing.leading
            assert admin.get(failing.keys.leader) is None  # given back, not left to run out
            other.tick()
            assert other.leading
            failing.tick()  # contends (and waits) again rather than "already holds it"
            assert not failing.leading
            assert other.leading
        finally:
            other.close()
            failing.close()
            admin.close()
