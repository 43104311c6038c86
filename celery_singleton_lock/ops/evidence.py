"""The evidence ``celery locks reap`` weighs besides the lock Redis: which task ids the
workers that answer ``inspect`` have, and which messages wait, or were delivered and not
acknowledged, in a Redis broker (every queue a message of the app can be in).

Neither proves a hold alive or gone by itself; :mod:`.reconcile` says what each answer
proves (an empty answer proves nothing).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from celery_singleton_lock.ops.admin import decode_key

if TYPE_CHECKING:
    from celery import Celery

__all__ = ["BROKER_SCAN_LIMIT", "INSPECT_GRACE", "INSPECT_TIMEOUT", "BrokerSearch", "search_broker"]

#: The broker queue entries looked through per queue (a longer queue: not searched).
BROKER_SCAN_LIMIT = 100_000
#: How long ``inspect`` waits for workers to answer (seconds), and how much longer reap
#: waits for the broadcast itself (a broker that does not answer) before taking it as no
#: answer.
INSPECT_TIMEOUT = 1.0
INSPECT_GRACE = 15.0
#: Exchanges whose queues carry Celery's control replies and events, never tasks.
_NOT_TASK_EXCHANGES = ("celeryev",)
_NOT_TASK_SUFFIX = ".pidbox"


# ----------------------------------------------------------------------------- workers


@dataclass(frozen=True)
class _Workers:
    """What the workers that answered ``inspect`` said: the task ids they know, and
    whether any answered at all."""

    known: frozenset[str] = frozenset()
    answered: bool = False


def _ask_workers(app: Celery, task_ids: Sequence[str], timeout: float) -> _Workers:
    """The task ids among ``task_ids`` that an answering worker has active, reserved or
    scheduled (one ``query_task`` broadcast). A broker failure counts as no answer."""
    if not task_ids:
        return _Workers()
    try:
        replies: Mapping[str, Any] = (
            app.control.inspect(timeout=timeout).query_task(*task_ids) or {}
        )
    except Exception:  # noqa: BLE001 - an unreachable broker: nobody answered
        return _Workers()
    known: set[str] = set()
    for reply in replies.values():
        if not isinstance(reply, Mapping):
            continue
        for task_id, found in cast("Mapping[str, Any]", reply).items():
            state: object = found[0] if isinstance(found, (list, tuple)) and found else None
            if state != "ready":  # "ready": it has just ended
                known.add(str(task_id))
    return _Workers(frozenset(known), answered=bool(replies))


class _WorkerQuery(threading.Thread):
    """``_ask_workers`` in the background, so its timeout runs while we watch."""

    def __init__(self, app: Celery, task_ids: Sequence[str], timeout: float) -> None:
        super().__init__(name="reap-inspect", daemon=True)
        self.query = (app, list(task_ids), timeout)
        self.result = _Workers()

    def run(self) -> None:
        self.result = _ask_workers(*self.query)

    def answer(self) -> _Workers:
        """What the workers said; nothing when the broadcast is still stuck (a broker that
        does not answer) well after its timeout."""
        self.join(self.query[2] + INSPECT_GRACE)
        return self.result


# ------------------------------------------------------------------------------ broker


@dataclass(frozen=True)
class BrokerSearch:
    """The messages waiting or unacknowledged in the broker, read at one moment, and, when
    some could not be read (or the broker is not Redis), why: then a message found nowhere
    may still be queued."""

    messages: tuple[bytes, ...] = ()
    why: str = ""

    def has(self, task_id: str) -> bool | None:
        """Whether a message of ``task_id`` is there: True found, False proven absent, None
        not found in an incomplete search."""
        needle = task_id.encode()
        if any(needle in message for message in self.messages):
            return True
        return None if self.why else False


def _queue_name(queue: object) -> str:
    """The name of a queue given as a name or a ``kombu.Queue``."""
    return str(getattr(queue, "name", queue))


def _routed_queues(app: Celery) -> tuple[set[str], str]:
    """The queues the app's configuration routes tasks to (``task_default_queue``,
    ``task_queues``, ``task_routes``, each task's ``queue``), and why that list is not
    complete ("" when it is): a router function's queues cannot be listed."""
    conf = app.conf
    names = {str(conf.task_default_queue or "celery")}
    queues = conf.task_queues or ()
    names.update(_queue_name(queue) for queue in queues)
    routes = conf.task_routes
    routers: Iterable[Any] = (
        () if routes is None else routes if isinstance(routes, (list, tuple)) else (routes,)
    )
    why = ""
    for router in routers:
        if isinstance(router, Mapping):
            entries: Iterable[Any] = router.values()
        elif isinstance(router, (list, tuple)):
            entries = [pair[1] for pair in router if isinstance(pair, (list, tuple))]
        else:
            label = router if isinstance(router, str) else getattr(router, "__name__", router)
            why = f"task_routes has a router ({label!s}) whose queues cannot be listed"
            continue
        for route in entries:
            if isinstance(route, Mapping):
                queue = route.get("queue")
                if queue:
                    names.add(_queue_name(queue))
            elif route:
                names.add(_queue_name(route))  # a queue name (or a Queue) for the route
    for task in list(app.tasks.values()):
        queue = getattr(task, "queue", None)
        if queue:
            names.add(_queue_name(queue))
    return names, why


def _redis_broker_url(app: Celery) -> tuple[str | None, str]:
    """The URL of a Redis broker to search, or None and why not."""
    url = app.conf.broker_url
    text = url if isinstance(url, str) else ""
    scheme = text.split("://", 1)[0] if "://" in text else (text or "amqp")
    if not isinstance(url, str) or ";" in url:
        return None, "the broker URL names several servers, whose queues are not searched"
    if scheme not in ("redis", "rediss", "unix", "redis+socket"):
        return None, f"the broker ({scheme}://) is not Redis: its queues cannot be searched"
    return url.replace("redis+socket://", "unix://", 1), ""


def search_broker(app: Celery, limit: int = BROKER_SCAN_LIMIT) -> BrokerSearch:
    """Every message waiting or delivered-but-unacknowledged in the app's Redis broker, read
    in one transaction: each queue the app routes to or the broker has bound, with its
    priority lists (``<queue>\\x06\\x16<step>``), and the ``unacked`` hash (names as the
    app's ``broker_transport_options`` set them). Incomplete (with why) when the broker is
    not Redis, a router function hides queues, or a queue is too long or unreadable."""
    url, why = _redis_broker_url(app)
    if url is None:
        return BrokerSearch(why=why)
    routed, why = _routed_queues(app)
    import redis  # noqa: PLC0415 - only for a Redis broker
    from kombu.transport.redis import PRIORITY_STEPS, Channel  # noqa: PLC0415

    options = dict(app.conf.broker_transport_options or {})
    prefix = str(options.get("global_keyprefix") or "")
    sep = str(options.get("sep") or Channel.sep)
    steps = [step for step in options.get("priority_steps") or PRIORITY_STEPS if step]
    unacked = prefix + str(options.get("unacked_key") or Channel.unacked_key)
    bindings = prefix + Channel.keyprefix_queue % ""
    if options.get("ack_emulation", Channel.ack_emulation) is False:
        why = why or "ack_emulation is off, so messages a worker has taken are not in Redis"
    broker = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
    try:
        queues = set(routed)
        for key in broker.scan_iter(match=_glob_escape(bindings) + "*", count=500):
            exchange = decode_key(key)[len(bindings) :]
            if exchange in _NOT_TASK_EXCHANGES or exchange.endswith(_NOT_TASK_SUFFIX):
                continue
            for member in cast("set[bytes]", broker.smembers(key)):
                queues.add(decode_key(member).split(sep)[-1])
        queues.discard("")
        keys = sorted(
            prefix + name
            for queue in queues
            for name in (queue, *(f"{queue}{sep}{step}" for step in steps))
        )
        pipe = broker.pipeline(transaction=True)
        for key in keys:
            pipe.lrange(key, 0, limit)
        if int(broker.hlen(unacked)) > limit:
            why = why or f"more than {limit} unacknowledged messages to search"
        else:
            keys.append(unacked)
            pipe.hvals(unacked)  # last: the one reply that is not a list's
        replies = pipe.execute(raise_on_error=False)
    except redis.RedisError as exc:
        return BrokerSearch(why=f"the broker could not be searched ({type(exc).__name__}: {exc})")
    finally:
        broker.close()
    messages: list[bytes] = []
    for key, reply in zip(keys, replies, strict=True):
        if isinstance(reply, redis.ResponseError) and "WRONGTYPE" in str(reply):
            continue  # not a list (or hash): no message is there
        if isinstance(reply, Exception):
            why = why or f"the broker could not be searched ({reply})"
        elif len(reply) > limit:
            why = why or f"queue {key!r} holds more than {limit} messages to search"
        else:
            messages.extend(cast("list[bytes]", reply))
    return BrokerSearch(tuple(messages), why)


def _glob_escape(text: str) -> str:
    """``text`` as a literal in a Redis glob."""
    return "".join(f"\\{char}" if char in "\\*?[]" else char for char in text)
