"""What each mode costs on the wire, counted by a real redis-server (``INFO commandstats``)
for one eager call beside plain run scope: the figures ``docs/modes.md`` quotes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery

from celery_singleton_lock import LockedTask
from celery_singleton_lock.config import clear_settings
from celery_singleton_lock.testing import RedisServer

#: Options of each mode -> (round trips of one call, Redis commands run for it, counting
#: those inside scripts): what docs/modes.md says.
MODES: dict[str, tuple[dict[str, Any], int, int]] = {
    "run scope": ({}, 2, 4),
    "lock_rate_limit": ({"lock_rate_limit": "100/s"}, 3, 9),
    "lock_release='success'": ({"lock_release": "success", "lock_hold": 60}, 2, 7),
    # queue scope: the run's script also asks (ZSCORE) whether this task id finished already
    "queue scope": ({"lock_scope": "queue"}, 3, 13),
    "queue scope, lock_release='start'": ({"lock_scope": "queue", "lock_release": "start"}, 3, 9),
    "lock_limit=3": ({"lock_limit": 3}, 2, 20),
    "queue scope, coalesce": ({"lock_scope": "queue", "lock_on_conflict": "coalesce"}, 3, 15),
    # and one plain GET at delivery: was this call superseded?
    "queue scope, replace": ({"lock_scope": "queue", "lock_on_conflict": "replace"}, 3, 16),
    "lock_debounce": ({"lock_debounce": 0.5}, 4, 15),
    # a key and a share of two limits, one of them over the argument
    "lock_limits (2 limits)": (
        {"lock_limits": [("n:{n}", 3), ("all", 10)], "lock_weight": 2},
        2,
        30,
    ),
}


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    """A redis-server of its own: nothing but the calls measured talks to it."""
    with RedisServer() as started:
        yield started


@pytest.mark.parametrize("mode", list(MODES))
def test_round_trips_per_call(server: RedisServer, mode: str) -> None:
    """One call of a task in ``mode`` makes the documented number of round trips (EVALSHA
    each) and runs the documented number of Redis commands, scripts included."""
    options, round_trips, commands = MODES[mode]
    app = Celery("trips", broker="memory://", set_as_current=False)
    app.conf.update(singleton_lock_url=server.url, task_always_eager=True)

    @app.task(name="trips.job", base=LockedTask, shared=False, **options)
    def job(n: int) -> int:
        """Does nothing: only the lock's traffic is counted."""
        return n

    client = redis.Redis.from_url(server.url)
    try:
        assert job.delay(0).get() == 0  # scripts loaded, client connected
        client.flushall()
        client.config_resetstat()
        assert job.delay(1).get() == 1
        stats = client.info("commandstats")
        counted = {
            name.removeprefix("cmdstat_"): int(entry["calls"])
            for name, entry in stats.items()
            if not name.startswith(("cmdstat_config", "cmdstat_info"))
        }
        assert counted.get("evalsha", 0) == round_trips, counted
        assert sum(counted.values()) - counted.get("evalsha", 0) == commands, counted
    finally:
        client.close()
        clear_settings(app)
        app.close()
