"""The modes against a fake run (:mod:`tests.modes.fake`): queue scope, ``lock_release``,
``lock_rate_limit``, ``lock_debounce``, ``lock_order``, ``lock_on_lost`` and stacked limits,
each driven through the real pipelines on the session's private redis-server, with no
worker and no broker. Behaviour is read from Redis (holders, companion keys, PTTL) and
from what the fake recorded (messages sent, retries asked, calls handed the key)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery.exceptions import Ignore, Retry

from celery_singleton_lock import LockLost, TaskThrottled
from celery_singleton_lock._observe import skip_record_key
from celery_singleton_lock.engine.keyspace import DONE, STARTS, companion_key
from celery_singleton_lock.engine.stack import stack_base
from celery_singleton_lock.modes.debounce import HEADER_DEBOUNCE
from celery_singleton_lock.modes.parking import HEADER_PARKED, HEADER_TURN
from celery_singleton_lock.modes.scope import queue_token
from celery_singleton_lock.runtime import headers as hdr
from celery_singleton_lock.testing import RedisServer
from tests.modes.fake import Delivery, Ended, Fake, fake_for

#: A bound for waits that only run out when the behaviour is broken.
PATIENCE = 30.0


@pytest.fixture
def fake(redis_server: RedisServer) -> Iterator[Fake]:
    """A fake app on the session's private server, under a prefix of its own."""
    with fake_for(redis_server.url) as made:
        yield made


def holder_id(fake: Fake, key: str) -> str | None:
    """The task id holding ``key`` now (None: free, or not a task's hold)."""
    holder = fake.holder(key)
    return None if holder is None else holder.task_id


def skip_reason(fake: Fake, task_id: str) -> str | None:
    """The reason in the skip record of ``task_id`` (None: no record)."""
    raw = fake.redis.get(skip_record_key(fake.prefix, task_id))
    return None if raw is None else str(json.loads(raw)["reason"])


# -- lock_scope="queue" --------------------------------------------------------------------


def test_queue_scope_run_claims_the_publish_hold_and_a_late_copy_is_dropped(fake: Fake) -> None:
    """queue scope: a publish holds the key for its message (a duplicate publishes nothing
    and gets its result); the delivery claims that hold under a token of its own; its end
    frees the key and records the task id as finished, so a late copy of the message does
    not run."""
    task = fake.task(lock_scope="queue")
    key = task.lock_key("a")
    [message] = fake.publish(task, "a", n=1).sent
    assert message.headers[hdr.HEADER_KEY] == key
    queued = fake.holder(key)
    assert queued is not None
    assert (queued.task_id, queued.info.get("queued")) == (message.task_id, True)
    assert queued.token == queue_token(message.task_id)

    duplicate = fake.publish(task, "a", n=2)
    assert duplicate.sent == []
    assert duplicate.result.id == message.task_id

    during: list[Any] = []

    def body() -> int:
        during.append(fake.holder(key))
        return 7

    ran = fake.deliver_message(task, message, body=body)
    assert (ran.ran, ran.value) == (True, 7)
    [claimed] = during
    assert claimed.task_id == message.task_id
    assert "queued" not in claimed.info
    assert claimed.token not in (None, queued.token)
    assert fake.holder(key) is None
    assert fake.redis.zscore(companion_key(key, DONE), message.task_id) is not None

    late = fake.deliver_message(task, message)
    assert isinstance(late.raised, Ignore)
    assert not late.ran
    assert fake.holder(key) is None


# -- lock_release --------------------------------------------------------------------------


def test_release_at_start_frees_the_key_as_the_body_starts(fake: Fake) -> None:
    """lock_release="start": while the body runs the key is free, so a new call publishes a
    message of its own; the run reports its hold ended at STARTED and releases nothing at
    its end."""
    task = fake.task(lock_scope="queue", lock_release="start")
    key = task.lock_key("a")
    [message] = fake.publish(task, "a").sent
    during: list[Any] = []

    def body() -> None:
        during.append(fake.holder(key))
        during.append(fake.publish(task, "a"))

    ran = fake.deliver_message(task, message, body=body)
    assert ran.ran, ran.raised
    free, again = during
    assert free is None
    [new] = again.sent
    assert new.task_id != message.task_id
    assert ran.run.ended == [Ended("STARTED", held=True, hold=0.0)]
    assert holder_id(fake, key) == new.task_id  # the new call's hold is left alone


def test_release_on_success_keeps_the_key_for_lock_hold(fake: Fake) -> None:
    """lock_release="success": a successful run's key stays held lock_hold seconds (an
    unrenewed hold naming its task id, marked held: success), so a call meanwhile meets the
    policy; a failed run frees it at once."""
    task = fake.task(lock_release="success", lock_hold=30.0)
    key = task.lock_key("a")
    ran = fake.deliver(task, "a")
    assert ran.ran
    assert ran.run.ended == [Ended("SUCCESS", held=True, hold=30.0)]
    held = fake.holder(key)
    assert held is not None
    assert (held.task_id, held.info.get("held")) == (ran.task_id, "success")
    assert held.remaining_ms is not None
    assert 0 < held.remaining_ms <= 30_000  # the server's count of the hold, not renewed

    skipped = fake.deliver(task, "a")
    assert not skipped.ran
    assert skip_reason(fake, skipped.task_id) == "held"

    def fails() -> None:
        raise RuntimeError("the body failed")

    other = task.lock_key("b")
    failed = fake.deliver(task, "b", body=fails)
    assert isinstance(failed.raised, RuntimeError)
    assert failed.run.ended == [Ended("FAILURE", held=True, hold=0.0)]
    assert fake.holder(other) is None


# -- lock_rate_limit -----------------------------------------------------------------------


def test_rate_limit_skips_a_start_over_the_rate(fake: Fake) -> None:
    """lock_rate_limit="2/m" under skip: two runs start (recorded in the key's starts), the
    third is skipped as throttled and gives the key back; its start is not recorded."""
    task = fake.task(lock_rate_limit="2/m")
    key = task.lock_key("a")
    runs = [fake.deliver(task, "a") for _ in range(3)]
    assert [run.ran for run in runs] == [True, True, False]
    assert runs[2].raised is None
    assert skip_reason(fake, runs[2].task_id) == "throttled"
    members = fake.redis.zrange(companion_key(key, STARTS), 0, -1)
    starts = {str(member).split(":")[0] for member in members}  # "<task id>:<server time>"
    assert starts == {runs[0].task_id, runs[1].task_id}
    assert fake.holder(key) is None


def test_rate_limit_retries_when_the_window_frees(fake: Fake) -> None:
    """lock_rate_limit under retry: the run over the rate raises Retry with TaskThrottled,
    coming back no sooner than the server said the window frees; the key is given back."""
    task = fake.task(lock_rate_limit="1/m", lock_on_conflict="retry")
    key = task.lock_key("a")
    assert fake.deliver(task, "a").ran
    throttled = fake.deliver(task, "a")
    assert isinstance(throttled.raised, Retry)
    [asked] = throttled.run.retried
    assert isinstance(asked.exc, TaskThrottled)
    assert asked.exc.retry_in is not None
    assert 0 < asked.exc.retry_in <= 60
    assert asked.countdown >= asked.exc.retry_in
    assert asked.counted
    assert fake.holder(key) is None


def test_rate_limit_raises_task_throttled(fake: Fake) -> None:
    """lock_rate_limit under raise: the run over the rate fails with TaskThrottled."""
    task = fake.task(lock_rate_limit="1/m", lock_on_conflict="raise")
    assert fake.deliver(task, "a").ran
    throttled = fake.deliver(task, "a")
    assert isinstance(throttled.raised, TaskThrottled)
    assert not throttled.ran
    assert fake.holder(task.lock_key("a")) is None


# -- lock_debounce -------------------------------------------------------------------------


def test_debounce_runs_a_burst_once_with_its_last_call(fake: Fake) -> None:
    """lock_debounce: the calls of a burst are all published under the burst's task id,
    each with its generation and a countdown; delivered, only the latest generation runs
    (with the last call's arguments), older ones end without running, and the burst never
    runs a second time."""
    task = fake.task(lock_debounce=30.0)
    calls = [fake.publish(task, "a", n=n) for n in (1, 2, 3)]
    messages = [call.sent[0] for call in calls]
    assert len({message.task_id for message in messages}) == 1
    assert [message.headers[HEADER_DEBOUNCE] for message in messages] == [1, 2, 3]
    assert all(message.options["countdown"] > 0 for message in messages)

    stale = fake.deliver_message(task, messages[0])
    assert isinstance(stale.raised, Ignore)
    assert not stale.ran
    last = fake.deliver_message(task, messages[2])
    assert (last.ran, last.value) == (True, 3)
    again = [fake.deliver_message(task, message) for message in (messages[2], messages[1])]
    assert [delivery.ran for delivery in again] == [False, False]


# -- lock_order="enqueue" ------------------------------------------------------------------


def test_order_enqueue_runs_calls_in_publish_order(fake: Fake) -> None:
    """lock_order="enqueue": each publish takes a turn (carried in its message); a call
    delivered before its turn parks; the first call runs and hands the key to the second,
    which hands it to the third, whatever order the messages came in."""
    task = fake.task(lock_on_conflict="park", lock_order="enqueue")
    key = task.lock_key("a")
    first, second, third = (fake.publish(task, "a", n=n).sent[0] for n in (1, 2, 3))
    turns = [message.headers[HEADER_TURN] for message in (first, second, third)]
    assert turns == sorted(turns)
    assert len(set(turns)) == 3

    early = [fake.deliver_message(task, message) for message in (third, second)]
    assert [isinstance(delivery.raised, Ignore) for delivery in early] == [True, True]
    assert not any(delivery.ran for delivery in early)

    ran: list[Delivery] = [fake.deliver_message(task, first)]
    while ran[-1].run.handed:
        [handed] = ran[-1].run.handed
        assert handed.headers[HEADER_PARKED] == key
        ran.append(fake.deliver_message(task, handed))
    assert [delivery.value for delivery in ran] == [1, 2, 3]
    assert [delivery.task_id for delivery in ran] == [m.task_id for m in (first, second, third)]
    assert fake.holder(key) is None


def test_order_enqueue_keeps_a_turn_for_a_call_still_on_its_way(fake: Fake) -> None:
    """lock_order="enqueue": a later call parked while an earlier one's message has not come
    yet is not handed the key when the holder ends (the key frees, the line keeps the
    earlier call's turn); the earlier call runs when it comes and then hands the key on."""
    task = fake.task(lock_on_conflict="park", lock_order="enqueue")
    key = task.lock_key("a")
    first, second, third = (fake.publish(task, "a", n=n).sent[0] for n in (1, 2, 3))
    inner: list[Delivery] = []
    holder = fake.deliver_message(
        task, first, body=lambda: inner.append(fake.deliver_message(task, third))
    )
    assert holder.ran
    assert isinstance(inner[0].raised, Ignore)
    assert holder.run.handed == []  # the second call's turn comes first
    assert fake.holder(key) is None

    ran = fake.deliver_message(task, second)
    assert (ran.ran, ran.value) == (True, 2)
    [handed] = ran.run.handed
    assert handed.task_id == third.task_id
    assert fake.deliver_message(task, handed).value == 3


# -- lock_on_lost="raise" ------------------------------------------------------------------


def test_on_lost_raise_stops_the_body_when_its_lease_is_taken(fake: Fake) -> None:
    """lock_on_lost="raise" (the guard hook): once the key is taken from under a running
    body (another owner wrote it), the renewal finds the lease lost and the body is stopped
    with LockLost; the run reports its hold lost and leaves the new owner's key alone."""
    task = fake.task(lock_on_lost="raise", lock_timeout=0.5)
    key = task.lock_key("a")
    stopped: list[bool] = []

    def body() -> None:
        fake.redis.set(key, "someone else", px=60_000)
        deadline = time.monotonic() + PATIENCE
        while time.monotonic() < deadline:
            time.sleep(0.01)
        stopped.append(False)  # never reached when the watch works

    ran = fake.deliver(task, "a", body=body)
    assert isinstance(ran.raised, LockLost)
    assert stopped == []
    assert ran.run.ended == [Ended("FAILURE", held=False, hold=0.0)]
    assert fake.redis.get(key) == "someone else"


# -- lock_limits (stacked limits) ----------------------------------------------------------


def test_limit_full_run_scope_meets_its_policy(fake: Fake) -> None:
    """lock_limits in run scope under skip: a run whose key is free but whose limit is full
    is skipped (its key is not held), and runs once the share is given back."""
    task = fake.task(lock_limits=[("tenant:{tenant}", 1)])
    inner: list[Delivery] = []
    outer = fake.deliver(
        task, "a", tenant="t1", body=lambda: inner.append(fake.deliver(task, "b", tenant="t1"))
    )
    assert outer.ran
    [held_back] = inner
    assert (held_back.ran, held_back.raised) == (False, None)
    assert held_back.run.lock.held_back_by is not None
    assert fake.holder(task.lock_key("b", tenant="t1")) is None
    assert fake.deliver(task, "b", tenant="t1").ran


def test_limit_full_under_park_holds_the_call_back_in_redis(fake: Fake) -> None:
    """lock_limits under park: a run held back by a full limit ends without running
    (PARKED), kept in the lock Redis with its place in the limit's line, its key given
    back; no retry is published."""
    task = fake.task(lock_limits=[("tenant:{tenant}", 1)], lock_on_conflict="park")
    inner: list[Delivery] = []
    held: list[list[str]] = []
    base = stack_base(fake.prefix)

    def body() -> None:
        inner.append(fake.deliver(task, "b", tenant="t1"))
        held.append(sorted(fake.redis.scan_iter(match=f"{base}held*")))

    outer = fake.deliver(task, "a", tenant="t1", body=body)
    assert outer.ran
    [parked] = inner
    assert isinstance(parked.raised, Ignore)
    assert not parked.ran
    assert parked.run.retried == []
    assert task.AsyncResult(parked.task_id).state == "PARKED"
    assert held[0], "nothing kept in the held calls"
    kept = [
        name
        for name in held[0]
        if fake.redis.type(name) == "zset" and fake.redis.zscore(name, parked.task_id) is not None
    ]
    assert kept, f"{parked.task_id} in none of {held[0]}"
    assert fake.holder(task.lock_key("b", tenant="t1")) is None


def test_limit_full_in_queue_scope_sets_the_call_aside_with_its_hold(fake: Fake) -> None:
    """lock_limits in queue scope under skip: the accepted call is not dropped: it is set
    aside in the lock Redis (Retry, nothing published) and its key stays held for its
    message."""
    task = fake.task(lock_scope="queue", lock_limits=[("tenant:{tenant}", 1)])
    [first] = fake.publish(task, "a", tenant="t1").sent
    [second] = fake.publish(task, "b", tenant="t1").sent
    inner: list[Delivery] = []
    outer = fake.deliver_message(
        task, first, body=lambda: inner.append(fake.deliver_message(task, second))
    )
    assert outer.ran
    [aside] = inner
    assert isinstance(aside.raised, Retry)
    assert not aside.ran
    assert aside.run.retried == []
    assert holder_id(fake, task.lock_key("b", tenant="t1")) == second.task_id
