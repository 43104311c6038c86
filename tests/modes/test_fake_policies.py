"""The conflict policies (``lock_on_conflict``) against a fake run (:mod:`tests.modes.fake`):
the real lock on the session's private redis-server and every hook the pipelines call, but
no worker and no broker (a retry or a publish the lock asks for is recorded). A rival run
is delivered from inside the holder's body, so it meets the key held; what it gives, what
it records and what stays in Redis are asserted. The same policies on prefork workers:
tests/worker, tests/modes."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from celery.exceptions import Ignore, Retry

from celery_singleton_lock import TaskLocked, signals
from celery_singleton_lock._observe import skip_record_key
from celery_singleton_lock.engine import RedisLock
from celery_singleton_lock.engine.keyspace import PARKED, PENDING, companion_key
from celery_singleton_lock.modes.parking import HEADER_PARKED
from celery_singleton_lock.runtime import headers as hdr
from celery_singleton_lock.testing import RedisServer
from tests.modes.fake import Delivery, Fake, fake_for


@pytest.fixture
def fake(redis_server: RedisServer) -> Iterator[Fake]:
    """A fake app on the session's private server, under a prefix of its own."""
    with fake_for(redis_server.url) as made:
        yield made


def rival(fake: Fake, task: Any, *args: Any, **kwargs: Any) -> tuple[Delivery, Delivery]:
    """Deliver a call of ``task`` and, while its body holds the key, another one (a new
    message): both deliveries, the holder first."""
    inner: list[Delivery] = []

    def body() -> str:
        inner.append(fake.deliver(task, *args, **kwargs))
        return "holder"

    outer = fake.deliver(task, *args, body=body, **kwargs)
    assert outer.ran, outer.raised
    return outer, inner[0]


def holder_id(fake: Fake, key: str) -> str | None:
    """The task id holding ``key`` now (None: free, or not a task's hold)."""
    holder = fake.holder(key)
    return None if holder is None else holder.task_id


def skip_record(fake: Fake, task_id: str) -> dict[str, Any] | None:
    """The skip record of ``task_id`` (``skip_info``'s source), or None."""
    raw = fake.redis.get(skip_record_key(fake.prefix, task_id))
    return None if raw is None else dict(json.loads(str(raw)))


def test_skip_ends_the_rival_without_running_and_records_why(fake: Fake) -> None:
    """skip: the rival's body does not run and it ends without error; its skip record names
    the holder; the key stays the holder's until its run ends, then frees."""
    task = fake.task()
    seen: list[str | None] = []

    def body() -> None:
        seen.append(holder_id(fake, task.lock_key("a")))
        inner.append(fake.deliver(task, "a"))

    inner: list[Delivery] = []
    outer = fake.deliver(task, "a", body=body)
    skipped = inner[0]
    assert (skipped.ran, skipped.raised, skipped.value) == (False, None, None)
    assert seen == [outer.task_id]
    record = skip_record(fake, skipped.task_id)
    assert record is not None
    assert (record["holder_task_id"], record["reason"]) == (outer.task_id, "held")
    assert skipped.run.retried == []
    assert fake.holder(task.lock_key("a")) is None


def test_skip_turns_a_retried_attempt_into_an_uncounted_retry(fake: Fake) -> None:
    """skip: an attempt that is the work itself (a retry) is not dropped: it comes back, and
    that retry does not count against max_retries."""
    task = fake.task()
    inner: list[Delivery] = []
    outer = fake.deliver(task, "a", body=lambda: inner.append(fake.deliver(task, "a", retries=1)))
    retried = inner[0]
    assert isinstance(retried.raised, Retry)
    assert not retried.ran
    [asked] = retried.run.retried
    assert not asked.counted
    assert isinstance(asked.exc, TaskLocked)
    assert asked.exc.task_id == outer.task_id
    assert skip_record(fake, retried.task_id) is None


def test_retry_comes_back_after_the_retry_delay_naming_the_holder(fake: Fake) -> None:
    """retry: the rival raises Retry; the retry counts, waits lock_retry_delay, names the
    holder, and its message carries the key; nothing is skipped."""
    task = fake.task(lock_on_conflict="retry", lock_retry_delay=2.5)
    outer, retried = rival(fake, task, "a")
    assert isinstance(retried.raised, Retry)
    assert not retried.ran
    [asked] = retried.run.retried
    assert (asked.countdown, asked.counted, asked.duplicate) == (2.5, True, False)
    assert isinstance(asked.exc, TaskLocked)
    assert asked.exc.task_id == outer.task_id
    assert asked.message.headers[hdr.HEADER_KEY] == task.lock_key("a")
    assert skip_record(fake, retried.task_id) is None


def test_raise_fails_the_rival_with_task_locked(fake: Fake) -> None:
    """raise: the rival fails with TaskLocked naming the holder; nothing is retried."""
    task = fake.task(lock_on_conflict="raise")
    outer, failed = rival(fake, task, "a")
    assert isinstance(failed.raised, TaskLocked)
    assert failed.raised.task_id == outer.task_id
    assert failed.raised.key == task.lock_key("a")
    assert (failed.ran, failed.run.retried) == (False, [])


def test_wait_gives_up_with_task_locked_after_lock_wait(fake: Fake) -> None:
    """wait: a rival whose key stays held past lock_wait fails with TaskLocked."""
    task = fake.task(lock_on_conflict="wait", lock_wait=0.1)
    outer, failed = rival(fake, task, "a")
    assert isinstance(failed.raised, TaskLocked)
    assert failed.raised.task_id == outer.task_id
    assert not failed.ran


def test_wait_runs_the_rival_once_the_holder_frees(fake: Fake) -> None:
    """wait: a rival blocks while the key is held and runs, as the holder, once it frees
    (the holder here, a plain lock, frees it when the rival says it waits: lock_conflict)."""
    task = fake.task(lock_on_conflict="wait", lock_wait=60)
    key = task.lock_key("a")
    waiting = threading.Event()

    def told(sender: Any = None, **named: Any) -> None:
        if named.get("key") == key and named.get("policy") == "wait":
            waiting.set()

    blocker = RedisLock(fake.client, key, timeout=60)
    assert blocker.acquire(blocking=False)

    def free() -> None:
        if waiting.wait(30):
            blocker.release()

    freer = threading.Thread(target=free)
    signals.lock_conflict.connect(told, weak=False, dispatch_uid=f"fake-wait-{key}")
    freer.start()
    seen: list[str | None] = []
    try:
        ran = fake.deliver(task, "a", body=lambda: seen.append(holder_id(fake, key)))
    finally:
        freer.join(30)
        signals.lock_conflict.disconnect(dispatch_uid=f"fake-wait-{key}")
    assert waiting.is_set()
    assert ran.ran, ran.raised
    assert seen == [ran.task_id]
    assert fake.holder(key) is None


# -- the policies that keep calls: coalesce, replace, park ---------------------------------


def test_coalesce_collapses_calls_into_one_follow_up_handed_the_key(fake: Fake) -> None:
    """coalesce: calls made while the key is queued publish nothing and share one follow-up
    (kept in Redis with the latest arguments); the holder's end hands it the key and
    publishes it past the lock, and it runs with those arguments."""
    task = fake.task(lock_scope="queue", lock_on_conflict="coalesce")
    key = task.lock_key("a")
    first = fake.publish(task, "a", n=1)
    [message] = first.sent
    later = [fake.publish(task, "a", n=n) for n in (2, 3)]
    assert [p.sent for p in later] == [[], []]
    follow_up = {p.result.id for p in later}
    assert len(follow_up) == 1
    assert follow_up != {message.task_id}
    assert fake.redis.exists(companion_key(key, PENDING))

    ran = fake.deliver_message(task, message)
    assert (ran.ran, ran.value) == (True, 1)
    [handed] = ran.run.handed
    assert handed.task_id in follow_up
    assert (handed.args, handed.kwargs) == (("a",), {"n": 3})
    assert not fake.redis.exists(companion_key(key, PENDING))
    assert fake.holder(key).task_id == handed.task_id  # type: ignore[union-attr]

    after = fake.deliver_message(task, handed)
    assert (after.ran, after.value) == (True, 3)
    assert after.run.handed == []
    assert fake.holder(key) is None


def test_replace_supersedes_a_queued_holder(fake: Fake) -> None:
    """replace: a call made while the key's holder is still queued takes the key over and is
    published; the superseded call is REVOKED and its message, when delivered, does not
    run."""
    task = fake.task(lock_scope="queue", lock_on_conflict="replace")
    key = task.lock_key("a")
    [old] = fake.publish(task, "a", n=1).sent
    [new] = fake.publish(task, "a", n=2).sent
    assert fake.holder(key).task_id == new.task_id  # type: ignore[union-attr]
    assert task.AsyncResult(old.task_id).state == "REVOKED"

    stale = fake.deliver_message(task, old)
    assert isinstance(stale.raised, Ignore)
    assert not stale.ran
    assert fake.holder(key).task_id == new.task_id  # type: ignore[union-attr]
    ran = fake.deliver_message(task, new)
    assert (ran.ran, ran.value) == (True, 2)
    assert fake.holder(key) is None


def test_replace_makes_a_call_during_a_running_holder_its_follow_up(fake: Fake) -> None:
    """replace: a running holder is left to finish; the call becomes its follow-up."""
    task = fake.task(lock_scope="queue", lock_on_conflict="replace")
    [message] = fake.publish(task, "a", n=1).sent
    during: list[Any] = []
    ran = fake.deliver_message(
        task, message, body=lambda: during.append(fake.publish(task, "a", n=5))
    )
    assert ran.ran
    assert during[0].sent == []
    [handed] = ran.run.handed
    assert handed.task_id == during[0].result.id
    assert handed.kwargs == {"n": 5}


def test_park_parks_the_rival_and_hands_it_the_key_when_the_holder_ends(fake: Fake) -> None:
    """park: the rival ends without running (Ignore), shows PARKED and waits in the key's
    park queue; the holder's end hands it the key (a grant) and publishes it; delivered, it
    runs, and the park queue is empty."""
    task = fake.task(lock_on_conflict="park")
    key = task.lock_key("a")
    queued: list[list[str]] = []
    inner: list[Delivery] = []

    def body() -> None:
        inner.append(fake.deliver(task, "a", n=2))
        queued.append([str(m) for m in fake.redis.zrange(companion_key(key, PARKED), 0, -1)])

    outer = fake.deliver(task, "a", n=1, body=body)
    parked = inner[0]
    assert isinstance(parked.raised, Ignore)
    assert not parked.ran
    assert queued == [[parked.task_id]]
    assert task.AsyncResult(parked.task_id).state == "PARKED"

    [handed] = outer.run.handed
    assert handed.task_id == parked.task_id
    assert handed.headers[HEADER_PARKED] == key
    assert handed.kwargs == {"n": 2}
    assert fake.holder(key).task_id == parked.task_id  # type: ignore[union-attr]

    ran = fake.deliver_message(task, handed)
    assert (ran.ran, ran.value) == (True, 2)
    assert fake.redis.zcard(companion_key(key, PARKED)) == 0
    assert fake.holder(key) is None
