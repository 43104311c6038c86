"""``singleton_locks`` starts every test with nothing under the session's prefix: not only no
locks, but none of the state the modes keep beside them (throttle starts, a pending
follow-up, a debounce burst, finished runs) and no skip records. An inner pytest run with
Celery's in-process worker leaves that state in one test and checks it absent in the next.
"""

from __future__ import annotations

import pytest

from tests.plugin.conftest import RunSuite

pytestmark = pytest.mark.slow

CONFTEST = """
import pytest

pytest_plugins = ("celery.contrib.pytest", "celery_singleton_lock.pytest_plugin")

@pytest.fixture(scope="session")
def celery_config(singleton_lock_config):
    return {"broker_url": "memory://", "result_backend": "cache+memory://",
            **singleton_lock_config}
"""

SUITE = """
from celery_singleton_lock import LockedTask, RedisLock, skip_info


def tasks(app):
    @app.task(base=LockedTask, name="leak.throttled", lock_rate_limit="1/h", lock_keys=())
    def throttled():
        return "ran"

    @app.task(base=LockedTask, name="leak.skipper", lock_keys=())
    def skipper():
        return "ran"

    @app.task(base=LockedTask, name="leak.debounced", lock_debounce=60, lock_keys=())
    def debounced(n):
        return n

    @app.task(base=LockedTask, name="leak.coalesced", lock_scope="queue",
              lock_on_conflict="coalesce", lock_keys=())
    def coalesced(n):
        return n

    return throttled, skipper, debounced, coalesced


def under_prefix(locks):
    found = set()
    for pattern in (locks.prefix + ":*", locks.prefix + "~*", "{" + locks.prefix + "}~*"):
        for key in locks.client.scan_iter(match=pattern):
            found.add(key.decode() if isinstance(key, bytes) else key)
    return sorted(found)


def test_1_leaves_mode_state_behind(celery_app, celery_worker, singleton_locks):
    throttled, skipper, debounced, coalesced = tasks(celery_app)
    celery_worker.reload()
    assert throttled.delay().get(timeout=30) == "ran"
    assert throttled.delay().get(timeout=30) is None  # its key used up 1/h

    holder = RedisLock(singleton_locks.client, skipper.lock_key(), timeout=300)
    assert holder.acquire(blocking=False)
    skipped = skipper.delay()
    assert skipped.get(timeout=30) is None
    assert skip_info(skipped, app=celery_app) is not None

    debounced.delay(1)  # a burst that runs in a minute

    assert coalesced.delay(1).get(timeout=30) == 1  # a queue-scope run that finished
    busy = RedisLock(singleton_locks.client, coalesced.lock_key(), timeout=300)
    assert busy.acquire(blocking=False)
    coalesced.delay(2)  # the key is held: the call becomes the pending follow-up

    keys = under_prefix(singleton_locks)
    for suffix in (":starts", ":debounce", ":pending", ":done"):
        assert any(key.endswith(suffix) for key in keys), (suffix, keys)
    assert any("~skipped:" in key for key in keys), keys
    assert any(key.endswith("}~parking") for key in keys), keys  # the sweep's list
    assert sorted(singleton_locks.held()) == sorted([skipper.lock_key(), coalesced.lock_key()])


def test_2_starts_with_nothing_under_the_prefix(celery_app, celery_worker, singleton_locks):
    assert under_prefix(singleton_locks) == []
    throttled, skipper, *_ = tasks(celery_app)
    celery_worker.reload()
    assert throttled.delay().get(timeout=30) == "ran"  # not throttled by test 1's start
    assert skipper.delay().get(timeout=30) == "ran"
"""


def test_each_test_starts_with_no_mode_state_and_no_skip_records(run_suite: RunSuite) -> None:
    """A test that leaves throttle starts, a debounce burst, a pending follow-up, finished
    runs, a held lock and a skip record under the prefix is followed by one that finds
    nothing there, and whose throttled task is not throttled by the first one's start."""
    done = run_suite({"conftest.py": CONFTEST, "test_leaks.py": SUITE})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout
