"""Where ``celery locks reap`` looks for the message of a hold taken at publish: every queue
a Redis broker can hold it in, or "incomplete" and why (``ops.reconcile.search_broker``)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis
from celery import Celery
from kombu import Queue

from celery_singleton_lock.ops.reconcile import search_broker
from celery_singleton_lock.testing import RedisServer


def make_app(url: str, **conf: Any) -> Celery:
    app = Celery(f"broker-{uuid.uuid4().hex[:6]}", broker=url, set_as_current=False)
    app.conf.update(conf)
    return app


def publish(app: Celery, name: str, **options: Any) -> str:
    """Send task ``name`` (nobody consumes it); its task id."""
    return str(app.send_task(name, **options).id)


@pytest.mark.parametrize(
    ("routes", "queue"),
    [
        ({"b.routed": {"queue": "b-map"}}, "b-map"),
        ({"b.routed": "b-name"}, "b-name"),
        ([{"b.*": {"queue": Queue("b-glob")}}], "b-glob"),
        ([[("b.routed", {"queue": "b-pairs"})]], "b-pairs"),
    ],
    ids=["dict", "queue-name", "list-glob-Queue", "list-of-pairs"],
)
def test_every_queue_task_routes_names_is_searched(
    redis_server: RedisServer, routes: Any, queue: str
) -> None:
    """However ``task_routes`` names the queue, a message waiting there is found, and a
    task id with no message is proven absent."""
    app = make_app(redis_server.url, task_routes=routes)
    task_id = publish(app, "b.routed")
    found = search_broker(app)
    assert found.why == ""
    assert found.has(task_id) is True
    assert found.has(str(uuid.uuid4())) is False


def test_priority_lists_and_a_global_key_prefix(redis_server: RedisServer) -> None:
    """A message with a priority waits in ``<queue>\\x06\\x16<step>``; with the transport's
    ``global_keyprefix`` every key (queues, bindings, unacked) carries it: both are found."""
    prefix = f"p{uuid.uuid4().hex[:6]}:"
    queue = f"call-{uuid.uuid4().hex[:6]}"
    app = make_app(redis_server.url, broker_transport_options={"global_keyprefix": prefix})
    task_id = publish(app, "b.prio", priority=7, queue=queue)
    client = redis.Redis.from_url(redis_server.url)
    assert client.llen(f"{prefix}{queue}\x06\x166") == 1
    found = search_broker(app)
    assert found.has(task_id) is True
    client.delete(f"{prefix}{queue}\x06\x166")
    assert search_broker(app).has(task_id) is False


def test_a_router_function_makes_the_search_incomplete(redis_server: RedisServer) -> None:
    """A router function's queues cannot be listed: a message found is found, but one not
    found may be elsewhere (None, with why)."""

    def router(name: str, *args: Any, **kwargs: Any) -> dict[str, str]:
        return {"queue": "b-by-function"}

    app = make_app(redis_server.url, task_routes=(router,))
    task_id = publish(app, "b.any")
    found = search_broker(app)
    assert "cannot be listed" in found.why
    assert found.has(task_id) is True  # the queue is bound on the broker
    assert found.has(str(uuid.uuid4())) is None


@pytest.mark.parametrize(
    ("url", "options", "why"),
    [
        ("amqp://guest@localhost//", {}, "is not Redis"),
        ("redis://a:1/0;redis://b:1/0", {}, "several servers"),
        (None, {"ack_emulation": False}, "ack_emulation is off"),
    ],
    ids=["amqp", "failover-list", "no-ack-emulation"],
)
def test_what_cannot_be_searched_says_why(
    redis_server: RedisServer, url: str | None, options: dict[str, Any], why: str
) -> None:
    app = make_app(url or redis_server.url, broker_transport_options=options)
    found = search_broker(app)
    assert why in found.why
    assert found.has("any-task") is None
