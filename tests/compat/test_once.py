"""celery-once's behaviour on our engine, producer side (no worker needed): COMPAT.md
"celery-once" points 1-6 and 10.

Each test builds an app of its own whose ``ONCE`` points at database 2 of the compat
tests' private redis-server; nothing consumes its queue, so a published task stays queued
and keeps its lock. Tasks are defined with ``shared=False`` so that they stay on their
test's app.
"""

from __future__ import annotations

import pickle
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery, Task, states
from celery.exceptions import ImproperlyConfigured

from celery_singleton_lock import RedisLock, SingletonLockError, TaskLocked
from celery_singleton_lock.compat.once import AlreadyQueued, QueueOnce
from celery_singleton_lock.testing import RedisServer
from tests.compat.conftest import db_url, unique

MakeApp = Callable[..., Celery]
Db = Callable[[int], redis.Redis]


def once_conf(url: str, **settings: Any) -> dict[str, Any]:
    """celery-once's documented configuration, as its README writes it."""
    return {
        "backend": "celery_once.backends.Redis",
        "settings": {"url": url, "default_timeout": 60 * 60, **settings},
    }


@pytest.fixture
def once_app(make_app: MakeApp, compat_redis: RedisServer) -> Celery:
    """An app configured with ``app.conf.ONCE`` on database 2."""
    app = make_app()
    app.conf.ONCE = once_conf(db_url(compat_redis, 2))
    return app


def queued(app: Celery) -> int:
    """How many messages wait in ``app``'s queue."""
    with app.connection_for_write() as conn:
        return int(conn.default_channel.client.llen(app.conf.task_default_queue))


# -- 1. ONCE as documented; the backend string is recognised, not imported ---------------


@pytest.mark.parametrize(
    "backend", ["celery_once.backends.Redis", "celery_once.backends.redis.Redis"]
)
def test_the_documented_backend_string_is_recognised_not_imported(
    make_app: MakeApp, compat_redis: RedisServer, db: Db, backend: str
) -> None:
    """ONCE = {'backend': 'celery_once.backends.Redis', 'settings': {...}} works as written
    with no celery_once package anywhere: the string is recognised, never imported."""
    app = make_app()
    app.conf.ONCE = {**once_conf(db_url(compat_redis, 2)), "backend": backend}

    @app.task(shared=False, base=QueueOnce)
    def job(x: str) -> str:
        return x

    marker = unique("backend")
    job.delay(marker)
    assert db(2).exists(job.lock_key(marker))
    assert not any(name == "celery_once" or name.startswith("celery_once.") for name in sys.modules)


def test_a_flask_style_upper_case_configuration_works(compat_redis: RedisServer, db: Db) -> None:
    """An app configured the Flask way (conf.update of an upper-case config that carries
    ONCE) locks as documented."""
    flask_config = {
        "DEBUG": False,
        "TESTING": True,
        "SECRET_KEY": "x",
        "CELERY_BROKER_URL": db_url(compat_redis, 0),
        "ONCE": once_conf(db_url(compat_redis, 2)),
    }
    app = Celery("flaskish", broker=db_url(compat_redis, 0), set_as_current=False)
    app.conf.update(flask_config)
    app.conf.task_default_queue = unique("flaskish")

    @app.task(shared=False, base=QueueOnce)
    def job(x: str) -> str:
        return x

    marker = unique("flask")
    job.delay(marker)
    with pytest.raises(AlreadyQueued):
        job.delay(marker)
    assert db(2).exists(job.lock_key(marker))
    app.close()


@pytest.mark.parametrize(
    ("backend", "match"),
    [
        ("celery_once.backends.File", "file backend"),
        ("myproject.locks.DjangoBackend", "custom celery-once backends"),
    ],
)
def test_another_backend_is_refused_naming_the_setting(
    make_app: MakeApp, compat_redis: RedisServer, backend: str, match: str
) -> None:
    """A File or custom backend is an error naming ONCE['backend'] (the locks would
    otherwise silently live elsewhere)."""
    app = make_app()
    app.conf.ONCE = {**once_conf(db_url(compat_redis, 2)), "backend": backend}

    @app.task(shared=False, base=QueueOnce)
    def job(x: str) -> str:
        return x

    with pytest.raises(ImproperlyConfigured, match=rf"ONCE\['backend'\].*{match}"):
        job.delay("x")


def test_a_worker_refuses_to_start_on_a_refused_backend(
    make_app: MakeApp, compat_redis: RedisServer
) -> None:
    """The worker's start-up check reports a refused ONCE['backend'] before any task
    runs."""
    from celery_singleton_lock.integration import preflight  # noqa: PLC0415

    app = make_app()
    app.conf.ONCE = {**once_conf(db_url(compat_redis, 2)), "backend": "celery_once.backends.File"}

    @app.task(shared=False, base=QueueOnce)
    def job(x: str) -> str:
        return x

    with pytest.raises(ImproperlyConfigured, match=r"ONCE\['backend'\]"):
        preflight(app)


def test_a_missing_once_configuration_is_an_error(make_app: MakeApp) -> None:
    """Without app.conf.ONCE a QueueOnce task says what to configure."""
    app = make_app()

    @app.task(shared=False, base=QueueOnce)
    def job(x: str) -> str:
        return x

    with pytest.raises(ImproperlyConfigured, match="ONCE"):
        job.delay("x")


@pytest.mark.parametrize(
    ("where", "typo", "suggestion"),
    [("settings", "default_timout", "default_timeout"), ("task", "gracefull", "graceful")],
)
def test_a_misspelt_option_is_an_error_with_a_suggestion(
    make_app: MakeApp, compat_redis: RedisServer, where: str, typo: str, suggestion: str
) -> None:
    """A typo in ONCE['settings'] or in once={...} is reported with a suggestion instead
    of being ignored."""
    app = make_app()
    app.conf.ONCE = (
        once_conf(db_url(compat_redis, 2), **{typo: 1})
        if where == "settings"
        else once_conf(db_url(compat_redis, 2))
    )
    once = {typo: True} if where == "task" else {}

    @app.task(shared=False, base=QueueOnce, once=once)
    def job(x: str) -> str:
        return x

    with pytest.raises(ImproperlyConfigured, match=f"did you mean '{suggestion}'"):
        job.delay("x")


# -- 2. locked at enqueue; a direct call is not -----------------------------------------------


def test_delay_and_apply_async_raise_already_queued_while_held(once_app: Celery, db: Db) -> None:
    """The second delay() or apply_async() with the same arguments raises AlreadyQueued
    and publishes nothing; other arguments go through."""

    @once_app.task(shared=False, base=QueueOnce)
    def job(a: int, b: str) -> str:
        return b

    marker = unique("queued")
    job.delay(1, marker)
    with pytest.raises(AlreadyQueued):
        job.delay(1, marker)
    with pytest.raises(AlreadyQueued):
        job.apply_async(args=(1, marker))
    job.delay(2, marker)
    assert queued(once_app) == 2


def test_calling_the_task_directly_is_not_locked(once_app: Celery, db: Db) -> None:
    """task(...) runs the function even while the same call is queued, and leaves that
    queued call's lock alone."""

    @once_app.task(shared=False, base=QueueOnce)
    def job(a: int, b: str) -> str:
        return f"{a}{b}"

    marker = unique("direct")
    job.delay(1, marker)
    assert job(1, marker) == f"1{marker}"
    assert db(2).exists(job.lock_key(1, marker))
    with pytest.raises(AlreadyQueued):
        job.delay(1, marker)


# -- 3. AlreadyQueued.countdown and .message -----------------------------------------------


def test_already_queued_says_when_the_lock_expires(once_app: Celery) -> None:
    """AlreadyQueued.countdown is the seconds left on the lock (the task's timeout minus
    the time since), and .message reads "Expires in {countdown} seconds"."""

    @once_app.task(shared=False, base=QueueOnce, once={"timeout": 60})
    def job(x: str) -> str:
        return x

    marker = unique("countdown")
    first = job.delay(marker)
    with pytest.raises(AlreadyQueued) as raised:
        job.delay(marker)
    error = raised.value
    assert 55 < error.countdown <= 60
    assert error.message == f"Expires in {error.countdown} seconds"
    assert error.task_id == first.id
    assert error.key == job.lock_key(marker)


def test_already_queued_is_catchable_as_ours_and_pickles() -> None:
    """AlreadyQueued is also our TaskLocked and SingletonLockError, and survives a pickle
    round trip with its countdown."""
    error = AlreadyQueued(12.5, key="k", task_id="t")
    assert isinstance(error, TaskLocked)
    assert isinstance(error, SingletonLockError)
    back = pickle.loads(pickle.dumps(error))
    assert (type(back), back.countdown, back.message, back.key, back.task_id) == (
        AlreadyQueued, 12.5, "Expires in 12.5 seconds", "k", "t"
    )  # fmt: skip


# -- 4. graceful -------------------------------------------------------------------------


def test_graceful_task_option_returns_a_result_of_none(once_app: Celery) -> None:
    """once={'graceful': True} on the task: a duplicate raises nothing and returns a
    rejected result whose .result is None."""

    @once_app.task(shared=False, base=QueueOnce, once={"graceful": True})
    def job(x: str) -> str:
        return x

    marker = unique("graceful")
    job.delay(marker)
    result = job.delay(marker)
    assert result.result is None
    assert result.state == states.REJECTED
    assert queued(once_app) == 1


def test_graceful_per_call(once_app: Celery) -> None:
    """apply_async(..., once={'graceful': True}) is graceful for that call only."""

    @once_app.task(shared=False, base=QueueOnce)
    def job(x: str) -> str:
        return x

    marker = unique("graceful-call")
    job.delay(marker)
    assert job.apply_async(args=(marker,), once={"graceful": True}).result is None
    with pytest.raises(AlreadyQueued):
        job.apply_async(args=(marker,))


def test_per_call_keys_are_refused(once_app: Celery) -> None:
    """keys and unlock_before_run can only be set on the task: a per-call one is an error
    (celery-once ignored it silently)."""

    @once_app.task(shared=False, base=QueueOnce)
    def job(x: str) -> str:
        return x

    with pytest.raises(ImproperlyConfigured, match="where the task is defined"):
        job.apply_async(args=("x",), once={"keys": []})


# -- 5. keys ------------------------------------------------------------------------------


def test_keys_restrict_the_lock_to_those_parameters(once_app: Celery) -> None:
    """once={'keys': ['a']}: (1, 1) and (1, 2) are duplicates, (2, 2) is not; positional
    arguments are bound by name."""

    @once_app.task(shared=False, base=QueueOnce, once={"keys": ["a"]})
    def slow_add(a: int, b: int) -> int:
        return a + b

    tag = uuid.uuid4().int
    slow_add.delay(tag, 1)
    with pytest.raises(AlreadyQueued):
        slow_add.delay(tag, 2)
    with pytest.raises(AlreadyQueued):
        slow_add.delay(a=tag, b=3)
    slow_add.delay(tag + 1, 2)


def test_empty_keys_mean_one_at_a_time_whatever_the_arguments(once_app: Celery) -> None:
    """once={'keys': []}: any second call raises while one is queued."""

    @once_app.task(shared=False, base=QueueOnce, once={"keys": []}, name=unique("compat.only_one"))
    def only_one(a: int, b: int) -> int:
        return a + b

    only_one.delay(1, 1)
    with pytest.raises(AlreadyQueued):
        only_one.delay(2, 2)


def test_a_bound_tasks_self_is_left_out_of_the_key(once_app: Celery) -> None:
    """bind=True: self is not an argument of the key, with or without keys, so two calls
    with the same arguments are duplicates."""

    @once_app.task(shared=False, base=QueueOnce, bind=True, once={"keys": ["a"]})
    def bound_keys(self: Task[Any, Any], a: int, b: int) -> int:
        return a + b

    @once_app.task(shared=False, base=QueueOnce, bind=True)
    def bound_all(self: Task[Any, Any], a: int, b: int) -> int:
        return a + b

    tag = uuid.uuid4().int
    for task in (bound_keys, bound_all):
        task.delay(tag, 2)
        with pytest.raises(AlreadyQueued):
            task.delay(tag, 2)


# -- 6. timeout -----------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["task", "call", "default"])
def test_the_lock_expires_after_its_timeout(
    make_app: MakeApp, compat_redis: RedisServer, where: str
) -> None:
    """once={'timeout': N} on the task or per call, else ONCE's default_timeout: after N
    seconds an identical call goes through."""
    app = make_app()
    default = 1 if where == "default" else 3600
    app.conf.ONCE = {
        "backend": "celery_once.backends.Redis",
        "settings": {"url": db_url(compat_redis, 2), "default_timeout": default},
    }
    once = {"timeout": 1} if where == "task" else {}

    @app.task(shared=False, base=QueueOnce, once=once)
    def job(x: str) -> str:
        return x

    marker = unique("timeout")
    call = {"once": {"timeout": 1}} if where == "call" else {}
    job.apply_async(args=(marker,), **call)
    with pytest.raises(AlreadyQueued) as raised:
        job.delay(marker)
    assert raised.value.countdown <= 1
    time.sleep(1.2)
    job.delay(marker)


def test_the_default_timeout_is_one_hour(make_app: MakeApp, compat_redis: RedisServer) -> None:
    """Without default_timeout the lock lasts an hour."""
    app = make_app()
    app.conf.ONCE = {
        "backend": "celery_once.backends.Redis",
        "settings": {"url": db_url(compat_redis, 2)},
    }

    @app.task(shared=False, base=QueueOnce)
    def job(x: str) -> str:
        return x

    marker = unique("hour")
    job.delay(marker)
    with pytest.raises(AlreadyQueued) as raised:
        job.delay(marker)
    assert 3590 < raised.value.countdown <= 3600


# -- 10. URL forms; blocking -------------------------------------------------------------------


def test_redis_url_with_db_and_options(
    make_app: MakeApp, compat_redis: RedisServer, db: Db
) -> None:
    """redis://host:port/db?options: the locks land in that database, the options reach the
    client."""
    app = make_app()
    app.conf.ONCE = once_conf(db_url(compat_redis, 6) + "?socket_timeout=3")

    @app.task(shared=False, base=QueueOnce)
    def job(x: str) -> str:
        return x

    marker = unique("db6")
    job.delay(marker)
    assert db(6).exists(job.lock_key(marker))


@pytest.fixture
def socket_server(tmp_path: Path) -> Iterator[tuple[RedisServer, Path]]:
    """A private redis-server that also listens on a unix socket."""
    path = tmp_path / "redis.sock"
    with RedisServer(extra_args=("--unixsocket", str(path), "--unixsocketperm", "700")) as server:
        yield server, path


def test_redis_socket_url(make_app: MakeApp, socket_server: tuple[RedisServer, Path]) -> None:
    """redis+socket:///path.sock?db=N&socket_timeout=S: the locks go over the socket into
    database N."""
    _, path = socket_server
    app = make_app()
    app.conf.ONCE = once_conf(f"redis+socket://{path}?db=3&socket_timeout=2")

    @app.task(shared=False, base=QueueOnce)
    def job(x: str) -> str:
        return x

    marker = unique("socket")
    job.delay(marker)
    with pytest.raises(AlreadyQueued):
        job.delay(marker)
    check = redis.Redis(unix_socket_path=str(path), db=3)
    assert check.exists(job.lock_key(marker))
    check.close()


@pytest.mark.parametrize("url", ["rediss://127.0.0.1:6390/0", "redis://127.0.0.1:6390/0?ssl=true"])
def test_tls_urls_make_a_tls_client(make_app: MakeApp, url: str) -> None:
    """rediss://, and redis:// with ?ssl=true as celery-once read it, both mean TLS."""
    app = make_app()
    app.conf.ONCE = once_conf(url)

    @app.task(shared=False, base=QueueOnce)
    def job(x: str) -> str:
        return x

    from celery_singleton_lock import runtime  # noqa: PLC0415 - only to look at the client

    locking = runtime.locking_for(job)
    assert locking is not None
    assert locking.settings.url.startswith("rediss://")
    client = locking.client(app)
    assert isinstance(client, redis.Redis)
    assert client.connection_pool.connection_class is redis.SSLConnection


def test_blocking_waits_for_the_lock_at_enqueue(
    make_app: MakeApp, compat_redis: RedisServer, db: Db
) -> None:
    """blocking=True: a publish that finds the lock held waits up to blocking_timeout and
    goes through once the holder releases (0.5 s in; a 30 s blocking_timeout leaves a busy
    machine's timer thread plenty of room)."""
    app = make_app()
    app.conf.ONCE = once_conf(db_url(compat_redis, 2), blocking=True, blocking_timeout=30)

    @app.task(shared=False, base=QueueOnce)
    def job(x: str) -> str:
        return x

    marker = unique("blocking")
    other = RedisLock(db(2), job.lock_key(marker), timeout=30)
    assert other.acquire(blocking=False)
    releaser = threading.Timer(0.5, other.release)
    releaser.start()
    started = time.monotonic()
    try:
        job.delay(marker)
    finally:
        releaser.join(30)
    assert time.monotonic() - started > 0.4  # it waited for the release, then went through


def test_blocking_timeout_bounds_the_wait(
    make_app: MakeApp, compat_redis: RedisServer, db: Db
) -> None:
    """blocking with blocking_timeout=0.3: a lock that stays held raises AlreadyQueued
    after about 0.3 s; without blocking it raises at once."""
    app = make_app()
    app.conf.ONCE = once_conf(db_url(compat_redis, 2), blocking=True, blocking_timeout=0.3)

    @app.task(shared=False, base=QueueOnce)
    def job(x: str) -> str:
        return x

    marker = unique("bounded")
    job.delay(marker)
    started = time.monotonic()
    with pytest.raises(AlreadyQueued):
        job.delay(marker)
    # after its 0.3 s, not sooner; the upper bound (15 s spare for a busy machine) says it
    # gave up rather than waiting for the hour-long lock
    assert 0.25 < time.monotonic() - started < 0.3 + 15
