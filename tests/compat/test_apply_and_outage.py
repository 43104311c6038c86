"""Two things users of the predecessors rely on without their docs saying so: ``task.apply()``
runs the body (celery-singleton and celery-once locked only in ``apply_async``), and an
unreachable lock Redis reaches ``delay()``'s caller as a ``redis.RedisError`` (their errors
were redis-py's own). Real redis-servers throughout, and a real worker for the queued message.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
import redis
from celery import Celery, states

from celery_singleton_lock import LockBackendError, LockConnectionError, LockError, RedisLock
from celery_singleton_lock.compat.once import AlreadyQueued, QueueOnce
from celery_singleton_lock.compat.singleton import Singleton
from celery_singleton_lock.testing import CeleryWorker, RedisServer, free_port
from tests.compat.conftest import db_url, unique, wait_for

MakeApp = Callable[..., Celery]
Db = Callable[[int], redis.Redis]


def queued(app: Celery, queue: str | None = None) -> int:
    """How many messages wait in ``queue`` (default: the app's own queue)."""
    with app.connection_for_write() as conn:
        client = conn.default_channel.client
        return int(client.llen(queue or app.conf.task_default_queue))


def holder_id(client: redis.Redis, key: str) -> str | None:
    """The task id holding ``key`` now, None when free."""
    holder = RedisLock(client, key).holder()
    return holder.task_id if holder else None


def once_app(make_app: MakeApp, url: str) -> Celery:
    """An app whose celery-once configuration puts the locks at ``url``."""
    app = make_app()
    app.conf.ONCE = {
        "backend": "celery_once.backends.Redis",
        "settings": {"url": url, "default_timeout": 3600},
    }
    return app


# -- apply() runs the body ----------------------------------------------------------------


@pytest.mark.parametrize("base", ["once", "singleton"])
def test_apply_runs_the_body_while_an_identical_message_is_queued(
    make_app: MakeApp, compat_redis: RedisServer, db: Db, base: str
) -> None:
    """task.apply() of a compat task runs the body (SUCCESS with its return value) while the
    same call waits in the queue, and leaves that message's lock with it: a duplicate
    delay() is still a duplicate of the queued task."""
    ran: list[int] = []
    if base == "once":
        app = once_app(make_app, db_url(compat_redis, 2))
        lock_db = 2

        @app.task(shared=False, base=QueueOnce)
        def job(a: int, b: str) -> int:
            ran.append(a)
            return 2 * a

    else:
        app = make_app(singleton_backend_url=db_url(compat_redis, 1))
        lock_db = 1

        @app.task(shared=False, base=Singleton)
        def job(a: int, b: str) -> int:
            ran.append(a)
            return 2 * a

    marker = unique("apply")
    first = job.delay(21, marker)
    key = job.lock_key(21, marker)
    assert holder_id(db(lock_db), key) == first.id

    result = job.apply(args=(21, marker))

    assert (result.state, result.result, ran) == (states.SUCCESS, 42, [21])
    assert holder_id(db(lock_db), key) == first.id
    assert queued(app) == 1
    if base == "once":
        with pytest.raises(AlreadyQueued):
            job.delay(21, marker)
    else:
        assert job.delay(21, marker) == first
    assert queued(app) == 1


@pytest.mark.parametrize("base", ["once", "singleton"])
def test_apply_takes_no_lock(
    make_app: MakeApp, compat_redis: RedisServer, db: Db, base: str
) -> None:
    """apply() with nothing queued takes no lock either: the body sees no current lock,
    and a delay() made from inside it is published, not refused as its own duplicate."""
    from celery_singleton_lock import current_lock  # noqa: PLC0415

    inside: list[Any] = []
    if base == "once":
        app = once_app(make_app, db_url(compat_redis, 2))
        base_class: type[Any] = QueueOnce
    else:
        app = make_app(singleton_backend_url=db_url(compat_redis, 1))
        base_class = Singleton

    @app.task(shared=False, base=base_class)
    def job(x: str) -> str:
        inside.append(current_lock())
        inside.append(job.delay(x).id)
        return x

    marker = unique("apply-free")
    assert job.apply(args=(marker,)).get() == marker
    assert inside[0] is None
    assert holder_id(db(2 if base == "once" else 1), job.lock_key(marker)) == inside[1]
    assert queued(app) == 1


def test_always_eager_publishes_lock_but_apply_does_not(
    make_app: MakeApp, compat_redis: RedisServer, db: Db
) -> None:
    """Under task_always_eager, delay() runs the body at once under the lock taken at
    publish and frees it after (its eager run is not a plain apply()); apply() runs the
    body unlocked even while someone else holds the key."""
    from celery_singleton_lock import current_lock  # noqa: PLC0415

    app = once_app(make_app, db_url(compat_redis, 2))
    app.conf.task_always_eager = True
    held: list[bool] = []

    @app.task(shared=False, base=QueueOnce)
    def job(x: str) -> str:
        lock = current_lock()
        held.append(lock is not None and lock.owned())
        return x

    marker = unique("eager")
    assert job.delay(marker).get() == marker
    assert held == [True]
    assert holder_id(db(2), job.lock_key(marker)) is None

    someone = RedisLock(db(2), job.lock_key(marker), timeout=60)
    assert someone.acquire(blocking=False)
    assert job.apply(args=(marker,)).get() == marker
    assert held == [True, False]
    assert someone.owned()
    someone.release()


def test_apply_beside_a_queued_message_that_a_worker_then_runs(
    compat_proj: ModuleType, start_worker: Callable[..., CeleryWorker], db: Db
) -> None:
    """With a real worker: apply() runs the body in the caller while the identical message
    waits, the lock stays with that message, and when a worker picks it up it runs too and
    frees the lock (unlock_before_run's apply() also leaves the queued lock alone)."""
    queue = unique("compat-apply")
    name = unique("o-apply")
    tasks = (compat_proj.o_sleep, compat_proj.o_unlock)
    waiting = [task.apply_async(args=(name, 0.0), queue=queue) for task in tasks]
    for task, message in zip(tasks, waiting, strict=True):
        assert task.apply(args=(name, 0.0)).get(timeout=30) == name
        assert holder_id(db(2), task.lock_key(name, 0.0)) == message.id
    runs = db(3).lrange(f"events:{name}", 0, -1)
    assert sum(run.startswith("start") for run in runs) == 2

    start_worker(queue)
    for task, message in zip(tasks, waiting, strict=True):
        assert message.get(timeout=30) == name
        assert wait_for(lambda t=task: holder_id(db(2), t.lock_key(name, 0.0)) is None, 30)
    runs = db(3).lrange(f"events:{name}", 0, -1)
    assert sum(run.startswith("start") for run in runs) == 4


# -- an unreachable lock Redis is a redis.RedisError --------------------------------------


def _dead_url() -> str:
    """A Redis URL on a loopback port where nothing listens."""
    return f"redis://127.0.0.1:{free_port()}/0"


@pytest.mark.parametrize("base", ["once", "singleton"])
def test_an_unreachable_lock_redis_is_a_redis_error_for_delay(make_app: MakeApp, base: str) -> None:
    """With the lock Redis down, delay() raises what existing handlers catch: a
    redis.RedisError (also our LockBackendError, saying what redis-py said), and publishes
    nothing."""
    if base == "once":
        app = once_app(make_app, _dead_url())
        base_class: type[Any] = QueueOnce
    else:
        app = make_app(singleton_backend_url=_dead_url())
        base_class = Singleton

    @app.task(shared=False, base=base_class)
    def job(x: str) -> str:
        return x

    try:
        job.delay(unique("down"))
    except redis.RedisError as exc:  # what code written for the predecessors catches
        caught: BaseException = exc
    else:
        pytest.fail("delay() published with the lock Redis down")
    assert isinstance(caught, LockBackendError)
    assert isinstance(caught, LockError)
    assert isinstance(caught, redis.exceptions.ConnectionError)
    assert "Connection refused" in str(caught)
    assert queued(app) == 0


@pytest.mark.parametrize("base", ["once", "singleton"])
def test_a_stopped_lock_redis_is_redis_py_connection_error_for_delay(
    make_app: MakeApp, base: str
) -> None:
    """The lock Redis (a private server) serves a first call, then is stopped: the next
    delay() raises what celery-singleton's and celery-once's callers catch, redis-py's
    ConnectionError (whose cause is redis-py's own error), and it is also our
    LockBackendError; nothing more is published."""
    with RedisServer() as lock_server:
        if base == "once":
            app = once_app(make_app, lock_server.url)
            base_class: type[Any] = QueueOnce
        else:
            app = make_app(singleton_backend_url=lock_server.url)
            base_class = Singleton

        @app.task(shared=False, base=base_class)
        def job(x: str) -> str:
            return x

        job.delay(unique("up"))
        assert queued(app) == 1
        lock_server.stop()

        try:
            job.delay(unique("stopped"))
        except redis.exceptions.ConnectionError as exc:  # what the originals' callers catch
            caught: BaseException = exc
        else:
            pytest.fail("delay() published with the lock Redis stopped")
    assert isinstance(caught, LockConnectionError)
    assert isinstance(caught, LockBackendError)
    assert isinstance(caught.__cause__, redis.exceptions.ConnectionError)
    assert not isinstance(caught.__cause__, LockError)
    assert queued(app) == 1


def test_lock_connection_error_is_both_and_pickles() -> None:
    """LockConnectionError is a LockBackendError and a redis.exceptions.ConnectionError, and
    a pickle round trip keeps its class, message and lock name."""
    error = LockConnectionError("Redis error: Connection refused", "csl:t:{x}")
    assert isinstance(error, LockBackendError)
    assert isinstance(error, redis.exceptions.ConnectionError)
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is LockConnectionError
    assert (str(back), back.name) == (str(error), "csl:t:{x}")


def test_lock_backend_error_is_a_redis_error_and_pickles() -> None:
    """LockBackendError is a redis.exceptions.RedisError (and still a LockError) whose repr
    shows its message (not redis-py's "server:..."), and a pickle round trip (a result
    backend's) keeps its class, message and lock name."""
    error = LockBackendError("Redis error: Connection refused", "csl:t:{x}")
    assert isinstance(error, redis.exceptions.RedisError)
    assert repr(error) == "LockBackendError('Redis error: Connection refused', 'csl:t:{x}')"
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is LockBackendError
    assert (str(back), back.name) == (str(error), "csl:t:{x}")
    assert isinstance(back, redis.RedisError)
