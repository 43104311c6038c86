"""Both shims with real ``celery worker`` processes (and Celery's in-process test worker):
release when the run ends, expiry while running, crash recovery, retries,
``unlock_before_run`` and a subclass's own ``__call__``. COMPAT.md celery-singleton points
2, 5, 7 and 10, celery-once points 2, 7, 8 and 9, and the public upstream tests that need a
worker (celery-singleton's duplicate-after-success/-error, celery-once's Flask test).
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest
import redis
from celery import Celery, states
from celery.contrib.testing.worker import start_worker
from celery.exceptions import WorkerLostError

from celery_singleton_lock import RedisLock, runtime
from celery_singleton_lock.compat.once import AlreadyQueued
from celery_singleton_lock.compat.singleton import Singleton
from celery_singleton_lock.testing import CeleryWorker, RedisServer
from tests.compat.conftest import db_url, unique, wait_for

pytestmark = pytest.mark.slow

Db = Callable[[int], redis.Redis]
#: COMPAT.md: the lock is free at the latest this long after AsyncResult.get() returned.
RELEASE_WITHIN = 0.05


def started(db: Db, name: str, runs: int = 1) -> bool:
    """Whether ``runs`` runs of ``name`` have started (the tasks log to database 3)."""
    events = db(3).lrange(f"events:{name}", 0, -1)
    return sum(event.startswith("start") for event in events) >= runs


def holder_id(db: Db, number: int, key: str) -> str | None:
    """The task id holding ``key`` in database ``number`` now, or None when it is free."""
    holder = RedisLock(db(number), key).holder()
    return holder.task_id if holder else None


# -- celery-singleton ---------------------------------------------------------------------


def test_singleton_duplicate_while_running_gets_the_first_result(
    compat_proj: ModuleType, compat_worker: CeleryWorker, db: Db
) -> None:
    """While the first runs, an identical call returns its AsyncResult and nothing else
    runs; afterwards the lock is free."""
    name = unique("s-running")
    first = compat_proj.s_sleep.delay(name, 1.0)
    assert wait_for(lambda: started(db, name), 30)
    assert compat_proj.s_sleep.delay(name, 1.0) == first
    assert first.get(timeout=30) == name
    assert db(3).llen(f"events:{name}") == 2


@pytest.mark.parametrize("outcome", ["success", "failure"])
def test_singleton_lock_is_free_right_after_get(
    compat_proj: ModuleType, compat_worker: CeleryWorker, outcome: str
) -> None:
    """On success and on failure the lock is gone at the latest 50 ms after get() returned
    or raised: the same call then gets a new task id (upstream:
    test__queue_duplicate_after_success/error__different_ids)."""
    name = unique(f"s-{outcome}")
    task = compat_proj.s_sleep if outcome == "success" else compat_proj.s_fail
    for _ in range(3):
        first = task.delay(name)
        if outcome == "success":
            assert first.get(timeout=30) == name
        else:
            with pytest.raises(ValueError, match=name):
                first.get(timeout=30)
        again = wait_for(
            lambda f=first: (r := task.delay(name)).id != f.id and r,  # type: ignore[misc]
            RELEASE_WITHIN,
        )
        assert again, "the lock was still held 50 ms after get()"
        again.get(timeout=10, propagate=False)


def test_singleton_lock_expiry_admits_a_new_task_while_the_first_runs(
    compat_proj: ModuleType, compat_worker: CeleryWorker, db: Db
) -> None:
    """lock_expiry=1 and a 3 s body: during the first second an identical call is a
    duplicate; after it, an identical call queues a new task that runs beside the first."""
    name = unique("s-expiry")
    task = compat_proj.s_expiry
    first = task.delay(name, 3.0)
    assert wait_for(lambda: started(db, name), 30)
    assert task.delay(name, 3.0) == first
    time.sleep(1.3)
    second = task.delay(name, 3.0)
    assert second != first
    first.get(timeout=30)
    second.get(timeout=30)
    assert db(3).get(f"overlaps:{name}") == "1"


def test_singleton_late_end_never_frees_a_successors_lock(
    compat_proj: ModuleType, compat_worker: CeleryWorker, db: Db
) -> None:
    """A run that outlived its lock_expiry ends after someone else took the key: its
    release is owner-checked and leaves the successor's lock alone (celery-singleton
    deleted the key unconditionally)."""
    name = unique("s-late")
    task = compat_proj.s_expiry
    first = task.delay(name, 2.5)
    assert wait_for(lambda: started(db, name), 30)
    time.sleep(1.3)
    successor = RedisLock(db(1), task.lock_key(name, 2.5), timeout=30)
    assert successor.acquire(blocking=False)
    first.get(timeout=30)
    time.sleep(0.1)
    assert successor.owned()
    successor.release()


def test_singleton_crash_without_expiry_frees_the_lock_within_a_lease(
    compat_proj: ModuleType, start_worker: Callable[..., CeleryWorker], db: Db
) -> None:
    """No lock_expiry anywhere, and the whole worker is SIGKILLed mid-run: the lock still
    frees, within the run's renewed lease (singleton_lock_timeout, 2 s here), instead of
    being held for ever (the wait for it is bounded generously: 30 s)."""
    queue = unique("crash")
    worker = start_worker(queue, lease=2.0)
    name = unique("s-crash")
    first = compat_proj.s_sleep.apply_async((name, 60.0), queue=queue)
    assert wait_for(lambda: started(db, name), 30)
    key = compat_proj.s_sleep.lock_key(name, 60.0)
    time.sleep(2.5)  # beyond one lease: renewal is what keeps it
    assert holder_id(db, 1, key) == first.id
    worker.kill()
    assert wait_for(lambda: holder_id(db, 1, key) is None, 30)
    assert compat_proj.s_sleep.apply_async((name, 60.0), queue=queue) != first


def test_singleton_own_retry_goes_through_and_keeps_the_lock(
    compat_proj: ModuleType, compat_worker: CeleryWorker, db: Db
) -> None:
    """self.retry() is not swallowed as a duplicate of itself (celery-singleton 0.3.1 left
    it in RETRY for good): the retry runs, the lock stays held across the countdown, and
    is free after."""
    name = unique("s-retry")
    task = compat_proj.s_retry
    first = task.delay(name)
    assert wait_for(lambda: db(3).get(f"attempts:{name}") == "1", 30)
    time.sleep(0.3)  # in the retry countdown (1.5 s)
    holder = holder_id(db, 1, task.lock_key(name))
    again = task.delay(name)
    if db(3).get(f"attempts:{name}") == "1":  # the retry had not begun: still its countdown
        assert again == first  # (a machine that slept through the countdown checks less)
        assert holder == first.id
    assert first.get(timeout=15) == "attempt 2"
    assert first.state == states.SUCCESS
    assert db(3).lrange(f"held:{name}", 0, -1) == ["1", "1"]
    assert task.delay(name) != first


# -- Celery's in-process test worker ----------------------------------------------------------


@pytest.fixture
def inprocess_app(compat_redis: RedisServer) -> Iterator[Celery]:
    """An app for celery.contrib.testing.worker (solo pool, in a thread)."""
    app = Celery(f"inproc-{uuid.uuid4().hex[:6]}", set_as_current=False)
    app.conf.update(
        broker_url=db_url(compat_redis, 0), result_backend=db_url(compat_redis, 1),
        task_default_queue=unique("inproc"), broker_connection_retry_on_startup=True,
        result_backend_transport_options={"retry_policy": {"max_retries": 2}},
        result_expires=None,  # the backend's SETEX path warns (DeprecationWarning) in redis-py 8
    )  # fmt: skip
    app.conf.ONCE = {  # QueueOnce tasks defined earlier in this process are shared with it
        "backend": "celery_once.backends.Redis",
        "settings": {"url": db_url(compat_redis, 2)},
    }
    yield app
    app.close()


def test_singleton_release_under_the_in_process_test_worker(inprocess_app: Celery) -> None:
    """Under celery.contrib.testing.worker, for a task registered after the worker started,
    the lock is free at the latest 50 ms after get() returns or raises."""
    with start_worker(inprocess_app, pool="solo", perform_ping_check=False) as worker:

        @inprocess_app.task(base=Singleton)
        def late(*args: Any) -> Any:
            if args and args[0] == "fail":
                raise ValueError("fail")
            return list(args)

        worker.reload()
        for args in ((1, 2, 3), ("fail",)):
            first = late.apply_async(args=args)
            first.get(timeout=10, propagate=False)
            again = wait_for(
                lambda a=args, f=first: (r := late.apply_async(args=a)).id != f.id and r,  # type: ignore[misc]
                RELEASE_WITHIN,
            )
            assert again, f"{args}: still locked 50 ms after get()"
            again.get(timeout=10, propagate=False)


# -- celery-once ------------------------------------------------------------------------------


def test_once_raises_while_running_and_clears_when_done(
    compat_proj: ModuleType, compat_worker: CeleryWorker, db: Db
) -> None:
    """delay(); while it runs another delay() raises AlreadyQueued; once it has finished a
    delay() goes through (upstream: test_flask)."""
    name = unique("o-running")
    first = compat_proj.o_sleep.delay(name, 1.0)
    assert wait_for(lambda: started(db, name), 30)
    with pytest.raises(AlreadyQueued):
        compat_proj.o_sleep.delay(name, 1.0)
    assert first.get(timeout=30) == name
    assert wait_for(lambda: holder_id(db, 2, compat_proj.o_sleep.lock_key(name, 30)) is None,
                    RELEASE_WITHIN)  # fmt: skip
    compat_proj.o_sleep.delay(name, 1.0).get(timeout=30)


def test_once_lock_clears_when_the_task_raises(
    compat_proj: ModuleType, compat_worker: CeleryWorker, db: Db
) -> None:
    """A task that raises clears its lock too."""
    name = unique("o-fail")
    first = compat_proj.o_fail.delay(name)
    with pytest.raises(ValueError, match=name):
        first.get(timeout=30)
    assert wait_for(lambda: holder_id(db, 2, compat_proj.o_fail.lock_key(name)) is None,
                    RELEASE_WITHIN)  # fmt: skip
    compat_proj.o_fail.delay(name).get(timeout=10, propagate=False)


def test_once_killed_pool_process_frees_its_lock_at_once(
    compat_proj: ModuleType, compat_worker: CeleryWorker, db: Db
) -> None:
    """A pool process SIGKILLed mid-run (as the OOM killer does) cannot release its
    one-hour lock itself: the worker's parent frees it as soon as the process is gone
    (celery-once kept it for the hour)."""
    name = unique("o-killed")
    task = compat_proj.o_long
    first = task.delay(name)
    assert wait_for(lambda: started(db, name), 30)
    key = task.lock_key(name)
    holder = RedisLock(db(2), key).holder()
    assert holder is not None
    pid = holder.info["pid"]
    assert pid in compat_worker.children()
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(WorkerLostError):
        first.get(timeout=30)
    assert wait_for(lambda: holder_id(db, 2, key) is None, 30)
    assert task.apply_async((name,), queue=unique("nobody")) != first  # free, and not run


def test_once_unlock_before_run_frees_the_lock_as_the_body_starts(
    compat_proj: ModuleType, compat_worker: CeleryWorker, db: Db
) -> None:
    """unlock_before_run: while the body runs no lock is held, so an identical call is
    accepted; the body runs without a lock."""
    name = unique("o-unlock")
    first = compat_proj.o_unlock.delay(name, 1.5)
    assert wait_for(lambda: started(db, name), 30)
    second = compat_proj.o_unlock.delay(name, 1.5)
    assert second != first
    assert first.get(timeout=30) == name
    assert second.get(timeout=30) == name
    assert db(3).lrange(f"held:{name}", 0, -1) == ["0", "0"]


def test_once_retry_is_not_refused_and_keeps_the_lock(
    compat_proj: ModuleType, compat_worker: CeleryWorker, db: Db
) -> None:
    """self.retry(): the re-publish is never refused as a duplicate; during the countdown
    the lock is held, so an identical call raises AlreadyQueued."""
    name = unique("o-retry")
    task = compat_proj.o_retry
    first = task.delay(name)
    assert wait_for(lambda: db(3).get(f"attempts:{name}") == "1", 30)
    time.sleep(0.3)
    with pytest.raises(AlreadyQueued) as raised:
        task.delay(name)
    assert raised.value.task_id == first.id
    assert first.get(timeout=15) == "attempt 2"
    assert db(3).lrange(f"held:{name}", 0, -1) == ["1", "1"]


def test_once_retry_whose_key_is_taken_is_published_and_runs_later(
    compat_proj: ModuleType, compat_worker: CeleryWorker, db: Db
) -> None:
    """A retry with other arguments whose key another queued call holds is not refused
    (no AlreadyQueued inside retry()): it is published and runs once that key is free; the
    first attempt's own key is freed at once, not left to its lease."""
    name = unique("o-switch")
    task = compat_proj.o_switch
    parked = task.apply_async(kwargs={"name": name, "step": 2}, queue=unique("nobody"))
    first = task.delay(name)
    assert wait_for(lambda: db(3).lrange(f"steps:{name}", 0, -1) == ["1"], 30)
    time.sleep(1.5)  # the retry came and waits its turn behind the parked call
    assert first.state == states.RETRY
    assert db(3).lrange(f"steps:{name}", 0, -1) == ["1"]
    assert holder_id(db, 2, task.lock_key(name)) is None
    parked_lock = RedisLock(
        db(2), task.lock_key(name, 2), token=runtime.queue_token(parked.id)
    )  # the parked message's own hold, as its run would release it
    parked_lock.release()
    assert first.get(timeout=15) == 2


def test_once_subclass_call_wraps_the_locked_body(
    compat_proj: ModuleType, compat_worker: CeleryWorker, db: Db
) -> None:
    """A QueueOnce subclass made in a factory with its own __call__ (celery-once's Flask
    recipe), used as base=: its wrapper runs around the body, which holds the lock, and
    duplicates are still refused while it runs."""
    name = unique("o-context")
    first = compat_proj.o_context.delay(name)
    assert wait_for(lambda: started(db, name), 30)
    with pytest.raises(AlreadyQueued):
        compat_proj.o_context.delay(name)
    assert first.get(timeout=30) == name
    (record,) = [json.loads(item) for item in db(3).lrange(f"context:{name}", 0, -1)]
    assert record == {"inside": "flask-like", "locked": True}
