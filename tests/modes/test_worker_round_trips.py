"""Round trips to the lock Redis per call (issue 32): a queue-scope call takes one at
publish and two in the worker (the try, which also asks whether the message's run finished
already, and the release, which records that it did); a late copy of a finished message
takes one; a run-scope run takes two. Counted on the client's own connections (each
request sent is one round trip) while real scripts run on a real server."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery.exceptions import Ignore

from celery_singleton_lock.testing import RedisServer
from tests.modes.fake import Fake, fake_for


class _Sent:
    """Requests sent by one thread (the test's), while counting."""

    thread: int | None = None
    count = 0


class CountingConnection(redis.Connection):
    """A connection that counts the requests it sends for the counting thread (a pipeline
    is one request: one round trip)."""

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if _Sent.thread == threading.get_ident():
            _Sent.count += 1
        super().send_packed_command(command, check_health)


@pytest.fixture
def fake(redis_server: RedisServer) -> Iterator[Fake]:
    with fake_for(redis_server.url) as made:
        pool = made.client.connection_pool
        pool.disconnect()
        pool.connection_class = CountingConnection
        yield made


def round_trips(action: Any) -> tuple[int, Any]:
    """How many requests ``action()`` sent to the lock Redis from this thread, and its
    result."""
    _Sent.thread, _Sent.count = threading.get_ident(), 0
    try:
        result = action()
    finally:
        _Sent.thread = None
    return _Sent.count, result


def test_queue_scope_takes_one_round_trip_at_publish_and_two_in_the_worker(fake: Fake) -> None:
    task = fake.task(lock_scope="queue")
    # Warm up: scripts loaded, connections open.
    [warm] = fake.publish(task, "warm").sent
    fake.deliver_message(task, warm, body=lambda: None)

    trips, published = round_trips(lambda: fake.publish(task, "a"))
    [message] = published.sent
    assert trips == 1

    trips, ran = round_trips(lambda: fake.deliver_message(task, message, body=lambda: 7))
    assert (ran.ran, ran.value) == (True, 7)
    assert trips == 2

    trips, late = round_trips(lambda: fake.deliver_message(task, message, body=lambda: 8))
    assert isinstance(late.raised, Ignore)
    assert not late.ran
    assert trips == 1


def test_run_scope_takes_two_round_trips(fake: Fake) -> None:
    task = fake.task()
    fake.deliver(task, "warm", body=lambda: None)
    trips, ran = round_trips(lambda: fake.deliver(task, "a", body=lambda: 5))
    assert (ran.ran, ran.value) == (True, 5)
    assert trips == 2


def test_plain_protocol_still_drops_a_late_copy(fake: Fake) -> None:
    """Without scripts the try cannot ask about the finished run; the delivery asks
    itself, and a late copy still does not run."""
    fake.app.conf.singleton_lock_scripting = False
    task = fake.task(lock_scope="queue")
    [message] = fake.publish(task, "p").sent
    assert fake.deliver_message(task, message, body=lambda: 1).ran
    late = fake.deliver_message(task, message, body=lambda: 2)
    assert isinstance(late.raised, Ignore)
    assert not late.ran
