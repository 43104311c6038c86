"""celery-singleton's behaviour on our engine, producer side (no worker needed): COMPAT.md
"celery-singleton" points 1-6, 8 and 9, and the public upstream tests that need no worker.

Each test builds an app of its own on the compat tests' private redis-server; nothing
consumes its queue, so a published task stays queued and keeps its lock. Tasks are defined
with ``shared=False`` so that they stay on their test's app (Celery adds shared tasks to
every app finalized later, such as the in-process worker's).
"""

from __future__ import annotations

import pickle
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis
from celery import Celery, Task
from celery.exceptions import ImproperlyConfigured
from kombu.exceptions import EncodeError

from celery_singleton_lock import RedisLock, SingletonLockError, TaskLocked
from celery_singleton_lock.compat.singleton import (
    CelerySingletonException,
    DuplicateTaskError,
    Singleton,
    clear_locks,
    lock_store,
)
from celery_singleton_lock.testing import RedisServer
from tests.compat.conftest import db_url, unique

MakeApp = Callable[..., Celery]
Db = Callable[[int], redis.Redis]


def queued(app: Celery) -> int:
    """How many messages wait in ``app``'s queue."""
    with app.connection_for_write() as conn:
        client = conn.default_channel.client
        return int(client.llen(app.conf.task_default_queue))


# -- 1. a celery.Task subclass, on any app, with its three options --------------------------


def test_singleton_is_a_celery_task_usable_on_any_app(make_app: MakeApp) -> None:
    """Singleton is a celery.Task subclass that takes unique_on, raise_on_duplicate and
    lock_expiry as task options, on a new app per use, with the same task name again."""
    assert issubclass(Singleton, Task)
    results = []
    for _ in range(2):
        app = make_app()

        @app.task(shared=False, base=Singleton, name="compat.same_name", unique_on=["a"],
                  raise_on_duplicate=False, lock_expiry=30)  # fmt: skip
        def same_name(a: int, b: int = 0) -> int:
            return a + b

        assert same_name.unique_on == ["a"]
        assert same_name.lock_expiry == 30
        results.append(same_name.delay(uuid.uuid4().int, 1))
    assert results[0].id != results[1].id


def test_a_foreign_option_of_the_other_package_is_refused(make_app: MakeApp) -> None:
    """celery-once's ``once`` on a Singleton task is an error that says what to use, not
    an option that silently does nothing."""
    app = make_app()

    @app.task(shared=False, base=Singleton, once={"graceful": True})
    def wrong(a: int) -> int:
        return a

    with pytest.raises(ImproperlyConfigured, match="once"):
        wrong.delay(1)


# -- 2. lock at enqueue; duplicates get the first task's AsyncResult -------------------------


def test_duplicates_while_queued_get_the_first_result(make_app: MakeApp) -> None:
    """Ten identical calls with no worker at all publish one message and all return an
    AsyncResult equal to the first (upstream: test__queue_duplicates__same_id)."""
    app = make_app()

    @app.task(shared=False, base=Singleton)
    def simple(*args: Any) -> Any:
        return args

    marker = uuid.uuid4().hex
    results = [simple.apply_async(args=[1, 2, marker]) for _ in range(10)]
    assert set(results) == {results[0]}
    assert all(result.id == results[0].id for result in results)
    assert queued(app) == 1


def test_different_arguments_queue_different_tasks(make_app: MakeApp) -> None:
    """Calls with different arguments each queue a task of their own (upstream:
    test__queue_multiple_uniques__different_ids); delay() never raises on a duplicate."""
    app = make_app()

    @app.task(shared=False, base=Singleton)
    def simple(*args: Any) -> Any:
        return args

    marker = uuid.uuid4().hex
    results = [simple.apply_async(args=[i, i + 1, marker]) for i in range(5)]
    assert len({result.id for result in results}) == 5
    assert simple.delay(0, 1, marker) == results[0]
    assert queued(app) == 5


def test_a_duplicate_publishes_nothing_and_keys_bind_to_the_signature(make_app: MakeApp) -> None:
    """f(1, 2), f(1, b=2) and f(a=1, b=2) are one call: the later ones return the first
    task's result (celery-singleton keyed raw args, so they differed there)."""
    app = make_app()

    @app.task(shared=False, base=Singleton)
    def add(a: int, b: int) -> int:
        return a + b

    first = add.delay(7, 8)
    assert add.delay(7, b=8) == first
    assert add.apply_async(kwargs={"a": 7, "b": 8}) == first
    assert queued(app) == 1


# -- 3. unique_on ---------------------------------------------------------------------------


def test_unique_on_list_counts_only_those_parameters(make_app: MakeApp) -> None:
    """unique_on=['a', 'c']: positional and keyword arguments are bound by name, and only
    a and c decide what a duplicate is."""
    app = make_app()

    @app.task(shared=False, base=Singleton, unique_on=["a", "c"])
    def job(a: int, b: int, c: int, d: int = 4) -> int:
        return a * b * c * d

    tag = uuid.uuid4().int
    first = job.delay(tag, 3, 4, 5)
    assert job.delay(tag, 99, 4) == first
    assert job.delay(a=tag, b=0, c=4, d=0) == first
    assert job.delay(tag, 3, 5, 5) != first


def test_unique_on_string_is_one_parameter_name(make_app: MakeApp) -> None:
    """unique_on='c' means ['c'], whether c is given by position or by keyword."""
    app = make_app()

    @app.task(shared=False, base=Singleton, unique_on="c")
    def job(a: int, b: int = 2, c: int = 3, d: int = 4) -> int:
        return a * b * c * d

    tag = uuid.uuid4().int
    first = job.delay(1, b=3, c=tag, d=5)
    assert job.delay(2, 9, tag) == first
    assert job.delay(1, b=3, c=tag + 1, d=5) != first


def test_unique_on_naming_no_parameter_is_an_error(make_app: MakeApp) -> None:
    """A unique_on name that the task does not take fails loudly, naming unique_on."""
    app = make_app()

    @app.task(shared=False, base=Singleton, unique_on=["user"])
    def job(user_id: int) -> int:
        return user_id

    with pytest.raises(ImproperlyConfigured, match="unique_on"):
        job.delay(1)


# -- 4. raise_on_duplicate -------------------------------------------------------------------


def test_raise_on_duplicate_raises_with_the_holders_task_id(make_app: MakeApp) -> None:
    """raise_on_duplicate=True: a duplicate raises DuplicateTaskError whose task_id is the
    first task's (upstream: test__raise_on_duplicate__raises_duplicate_error)."""
    app = make_app()

    @app.task(shared=False, base=Singleton, raise_on_duplicate=True)
    def job(*args: Any) -> Any:
        return args

    marker = uuid.uuid4().hex
    first = job.delay(1, 2, marker)
    with pytest.raises(DuplicateTaskError) as raised:
        job.delay(1, 2, marker)
    assert raised.value.task_id == first.task_id
    assert raised.value.key == job.lock_key(1, 2, marker)
    assert queued(app) == 1


@pytest.mark.parametrize(
    ("setting", "option", "raises"),
    [
        (None, None, False),
        (True, None, True),
        (False, True, True),
        (True, False, False),
    ],
)
def test_raise_on_duplicate_setting_and_task_option(
    make_app: MakeApp, setting: bool | None, option: bool | None, raises: bool
) -> None:
    """singleton_raise_on_duplicate (default off) applies unless the task sets
    raise_on_duplicate, which wins either way."""
    conf = {} if setting is None else {"singleton_raise_on_duplicate": setting}
    app = make_app(**conf)

    @app.task(shared=False, base=Singleton, raise_on_duplicate=option)
    def job(x: str) -> str:
        return x

    marker = unique("raise")
    first = job.delay(marker)
    if raises:
        with pytest.raises(DuplicateTaskError):
            job.delay(marker)
    else:
        assert job.delay(marker) == first


def test_duplicate_task_error_is_catchable_three_ways_and_pickles() -> None:
    """DuplicateTaskError is celery-singleton's exception, our TaskLocked and our root, and
    survives a pickle round trip (result backends pickle exceptions)."""
    error = DuplicateTaskError("Attempted to queue a duplicate of task ID x", "x", "k")
    assert isinstance(error, CelerySingletonException)
    assert isinstance(error, TaskLocked)
    assert isinstance(error, SingletonLockError)
    back = pickle.loads(pickle.dumps(error))
    assert (type(back), back.task_id, back.key, str(back)) == (
        DuplicateTaskError, "x", "k", "Attempted to queue a duplicate of task ID x"
    )  # fmt: skip


def test_a_bad_raise_on_duplicate_value_is_an_error(make_app: MakeApp) -> None:
    """A non-bool singleton_raise_on_duplicate is reported naming the setting."""
    app = make_app(singleton_raise_on_duplicate="yes")

    @app.task(shared=False, base=Singleton)
    def job(x: int) -> int:
        return x

    with pytest.raises(ImproperlyConfigured, match="singleton_raise_on_duplicate"):
        job.delay(1)


# -- 5. lock_expiry ----------------------------------------------------------------------


@pytest.mark.parametrize("where", ["task", "setting", "both"])
def test_lock_expiry_lets_an_identical_call_in_afterwards(make_app: MakeApp, where: str) -> None:
    """lock_expiry (task option, or singleton_lock_expiry, the task option winning): once it
    passes, an identical call queues a new task."""
    conf = {"singleton_lock_expiry": 600 if where == "both" else 1} if where != "task" else {}
    app = make_app(**conf)
    option = {"lock_expiry": 1} if where in ("task", "both") else {}

    @app.task(shared=False, base=Singleton, **option)
    def job(x: str) -> str:
        return x

    marker = unique("expiry")
    first = job.delay(marker)
    assert job.delay(marker) == first
    time.sleep(1.2)
    assert job.delay(marker) != first


def test_without_expiry_a_queued_lock_has_a_long_lease_not_none(
    make_app: MakeApp, compat_redis: RedisServer, db: Db
) -> None:
    """With no expiry a queued task keeps its duplicates out, yet its key has a finite
    lease (a day), so a lost message cannot hold it for ever."""
    app = make_app(result_backend=db_url(compat_redis, 1))

    @app.task(shared=False, base=Singleton)
    def job(x: str) -> str:
        return x

    marker = unique("forever")
    job.delay(marker)
    holder = RedisLock(db(1), job.lock_key(marker)).holder()
    assert holder is not None
    assert holder.remaining_ms is not None
    assert 86_000_000 < holder.remaining_ms <= 86_400_000
    assert db(1).pttl(job.lock_key(marker)) > 0  # and the key itself expires too


# -- 6. where the locks live ----------------------------------------------------------------


def test_locks_live_on_the_result_backend_when_it_is_redis(
    make_app: MakeApp, compat_redis: RedisServer, db: Db
) -> None:
    """No singleton_backend_url: the locks go to the result backend's Redis (db 4 here),
    under the default prefix SINGLETONLOCK_."""
    app = make_app(result_backend=db_url(compat_redis, 4))

    @app.task(shared=False, base=Singleton)
    def job(x: str) -> str:
        return x

    marker = unique("backend")
    job.delay(marker)
    key = job.lock_key(marker)
    assert key.startswith("SINGLETONLOCK_:")
    assert db(4).exists(key)
    assert not db(0).exists(key)
    assert lock_store(app) == (db_url(compat_redis, 4), "SINGLETONLOCK_")


def test_locks_live_on_the_broker_without_a_redis_result_backend(
    make_app: MakeApp, compat_redis: RedisServer, db: Db
) -> None:
    """No singleton_backend_url and a result backend that is not Redis: the broker."""
    app = make_app(result_backend="cache+memory://")

    @app.task(shared=False, base=Singleton)
    def job(x: str) -> str:
        return x

    marker = unique("broker")
    job.delay(marker)
    assert db(0).exists(job.lock_key(marker))


@pytest.mark.parametrize(
    "spelling",
    ["singleton_backend_url", "SINGLETON_BACKEND_URL", "CELERY_SINGLETON_BACKEND_URL"],
)
def test_singleton_backend_url_wins_in_every_spelling(
    make_app: MakeApp, compat_redis: RedisServer, db: Db, spelling: str
) -> None:
    """singleton_backend_url (also old-style upper case) beats the result backend."""
    app = make_app(result_backend=db_url(compat_redis, 4), **{spelling: db_url(compat_redis, 5)})

    @app.task(shared=False, base=Singleton)
    def job(x: str) -> str:
        return x

    marker = unique("url")
    job.delay(marker)
    key = job.lock_key(marker)
    assert db(5).exists(key)
    assert not db(4).exists(key)


@pytest.mark.parametrize("spelling", ["singleton_key_prefix", "CELERY_SINGLETON_KEY_PREFIX"])
def test_singleton_key_prefix_sets_the_prefix(make_app: MakeApp, db: Db, spelling: str) -> None:
    """singleton_key_prefix (also upper case) heads every lock key."""
    app = make_app(**{spelling: "lock_prefix:"})

    @app.task(shared=False, base=Singleton)
    def job(x: str) -> str:
        return x

    marker = unique("prefix")
    job.delay(marker)
    key = job.lock_key(marker)
    assert key.startswith("lock_prefix:")
    assert db(0).exists(key)


def test_a_non_redis_broker_without_a_lock_url_is_an_error(make_app: MakeApp) -> None:
    """Nowhere Redis to keep the locks: an error that names singleton_backend_url."""
    app = make_app(broker_url="memory://", result_backend="cache+memory://")

    @app.task(shared=False, base=Singleton)
    def job(x: str) -> str:
        return x

    with pytest.raises(ImproperlyConfigured, match="singleton_backend_url"):
        job.delay("x")


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("singleton_backend_class", "myproject.locks.DjangoBackend"),
        ("CELERY_SINGLETON_BACKEND_CLASS", "myproject.locks.DjangoBackend"),
        ("singleton_backend_kwargs", {"ssl_cert_reqs": None}),
    ],
)
def test_a_custom_backend_is_refused_naming_the_setting(
    make_app: MakeApp, setting: str, value: Any
) -> None:
    """A custom storage backend (or arguments for one) is refused with an error naming the
    setting, not ignored: the locks would silently go elsewhere."""
    app = make_app(**{setting: value})

    @app.task(shared=False, base=Singleton)
    def job(x: str) -> str:
        return x

    with pytest.raises(ImproperlyConfigured, match=setting):
        job.delay("x")


def test_the_default_backend_class_named_explicitly_is_accepted(make_app: MakeApp) -> None:
    """Naming celery-singleton's own Redis backend is the default, not a custom one."""
    app = make_app(singleton_backend_class="celery_singleton.backends.redis.RedisBackend")

    @app.task(shared=False, base=Singleton)
    def job(x: str) -> str:
        return x

    marker = unique("default-backend")
    assert job.delay(marker) == job.delay(marker)


# -- 8. a publish error reaches the caller and frees the lock ---------------------------------


class Unserializable:
    """An argument the JSON serializer refuses: publishing it fails inside Celery."""


def test_publish_error_reaches_the_caller_unchanged_and_frees_the_lock(
    make_app: MakeApp, db: Db
) -> None:
    """When Celery's own apply_async raises (here the serializer), the caller gets that
    exception and the lock is gone, so the next call is not a duplicate of nothing
    (upstream: test__apply_async_fails__exception_reraised)."""
    app = make_app()

    @app.task(shared=False, base=Singleton)
    def job(x: Any) -> None:
        return None

    argument = Unserializable()
    key = job.lock_key(argument)
    with pytest.raises(EncodeError):
        job.delay(argument)
    assert not db(0).exists(key)
    assert queued(app) == 0
    with pytest.raises(EncodeError):  # again: no stale lock answered it as a duplicate
        job.delay(argument)


# -- 9. clear_locks ---------------------------------------------------------------------


def test_clear_locks_removes_only_locks_under_the_prefix(make_app: MakeApp, db: Db) -> None:
    """clear_locks(app) removes this package's locks under singleton_key_prefix and keys
    that celery-singleton itself left there, and nothing else: not another key under the
    prefix, not another prefix's lock, not the broker's queue."""
    prefix = f"clr{uuid.uuid4().hex[:6]}_"
    app = make_app(singleton_key_prefix=prefix)
    other_app = make_app(singleton_key_prefix=f"{prefix}other")

    @app.task(shared=False, base=Singleton)
    def job(x: int) -> int:
        return x

    @other_app.task(shared=False, base=Singleton, name="compat.other_job")
    def other_job(x: int) -> int:
        return x

    results = [job.delay(i) for i in range(5)]
    other_job.delay(1)
    broker = db(0)
    legacy = f"{prefix}{uuid.uuid4().hex}"  # celery-singleton's own format: prefix + md5
    broker.set(legacy, str(uuid.uuid4()))
    broker.set(f"{prefix}notes", "not a lock")
    broker.set(f"unrelated-{prefix}", "x")

    assert clear_locks(app) == 6
    assert not any(broker.exists(job.lock_key(i)) for i in range(5))
    assert not broker.exists(legacy)
    assert broker.get(f"{prefix}notes") == "not a lock"
    assert broker.get(f"unrelated-{prefix}") == "x"
    assert broker.exists(other_job.lock_key(1))
    assert queued(app) == 5
    assert job.delay(0) != results[0]  # free again


def test_clear_locks_signature_matches_worker_ready_use(make_app: MakeApp) -> None:
    """clear_locks takes the app alone, as a worker_ready receiver calls it, and is a
    no-op (0) when there is nothing to clear."""
    app = make_app(singleton_key_prefix=f"empty{uuid.uuid4().hex[:6]}_")
    assert clear_locks(app) == 0


def test_one_app_locks_on_two_urls_with_a_client_each(
    make_app: MakeApp, compat_redis: RedisServer, db: Db
) -> None:
    """A Singleton task (locks on the result backend) and a LockedTask (locks on the
    broker) of one app keep a Redis client each instead of rebuilding one in turns."""
    from celery_singleton_lock import LockedTask  # noqa: PLC0415
    from celery_singleton_lock.client import redis_for  # noqa: PLC0415

    app = make_app(result_backend=db_url(compat_redis, 4))

    @app.task(shared=False, base=Singleton)
    def old_style(x: str) -> str:
        return x

    @app.task(shared=False, base=LockedTask, lock_scope="queue")
    def new_style(x: str) -> str:
        return x

    marker = unique("two-urls")
    old_style.delay(marker)
    new_style.delay(marker)
    first = redis_for(app, db_url(compat_redis, 4))
    assert redis_for(app, compat_redis.url) is not first
    assert redis_for(app, db_url(compat_redis, 4)) is first
    assert db(4).exists(old_style.lock_key(marker))
    assert db(0).exists(new_style.lock_key(marker))
