"""A parked call as data: the result state and headers that mark it, how the park queue
keeps a call (what publishing it again needs), the sweep's list of keys with parked calls,
and a call's turn in its key's line (``lock_order="enqueue"``). :mod:`.park` decides when
a call parks and hands keys over; :mod:`.order` keeps turns; this module only names and
encodes."""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

from kombu.serialization import dumps, loads

from celery_singleton_lock.engine import atomic
from celery_singleton_lock.engine.stack import stack_base
from celery_singleton_lock.engine.wire import call
from celery_singleton_lock.modes.base import HandedCall

if TYPE_CHECKING:
    from celery_singleton_lock.engine.wire import LockClient
    from celery_singleton_lock.modes.base import Run
    from celery_singleton_lock.options import LockOptions

__all__ = [
    "HEADER_HELD",
    "HEADER_PARKED",
    "HEADER_TURN",
    "INDEX_KEEP",
    "PARKED",
    "decode_call",
    "encode_call",
    "index_key",
    "keep_ms",
    "leave_held",
    "mark_parked",
    "milliseconds",
    "parking_index",
    "priority_rank",
    "take_turn",
    "task_of",
    "turn_of",
]

log = logging.getLogger("celery_singleton_lock.task")

#: The result state of a parked call (meta: ``key``, ``position``).
PARKED = "PARKED"
#: Header of a message published from the park queue (its value: the key it parked on).
HEADER_PARKED = "singleton_lock_parked"
#: Header of a message published for a call that was held back in the lock Redis until it
#: fit (``modes.held``; its value: the key it locks).
HEADER_HELD = "singleton_lock_held"
#: Header of a call's turn in its key's line (``lock_order="enqueue"``, taken at publish).
HEADER_TURN = "singleton_lock_turn"
#: A process names a key in the sweep's list again after this many seconds, and the sweep
#: keeps a name at least ``INDEX_KEEP`` seconds (so no park goes unnamed in between).
INDEX_REFRESH = 5.0
INDEX_KEEP = 30
_INDEXED_MOST = 10_000
_indexed: dict[str, float] = {}
#: A park queue outlives its last change by at least this much (seconds).
MIN_KEEP = 86_400.0


def milliseconds(seconds: float) -> int:
    """Seconds as whole milliseconds, at least 1."""
    return max(1, int(seconds * 1000))


def parking_index(prefix: str) -> str:
    """The sorted set of lock keys with parked calls, which the sweep goes through (in a
    hash slot of its own, named after the prefix)."""
    return f"{{{prefix}}}~parking"


def encode_call(
    task_name: str,
    call: HandedCall,
    *,
    key: str,
    serializer: str,
    header: str = HEADER_PARKED,
    headers: dict[str, Any] | None = None,
) -> bytes:
    """A call as the park queue (or the held calls) keeps it: what publishing it again
    needs. Its headers name the key it waits for under ``header`` (``HEADER_PARKED``: it
    parked on the key; ``HEADER_HELD``: a limit or its rate held it back), with ``headers``
    added; a marker the message carried from an earlier wait is left out."""
    options = {name: value for name, value in call.options.items() if name != "task_id"}
    kept = {
        name: value
        for name, value in (options.get("headers") or {}).items()
        if name not in (HEADER_PARKED, HEADER_HELD)
    }
    options["headers"] = {**kept, **(headers or {}), header: key}
    content_type, encoding, body = dumps(
        [list(call.args), dict(call.kwargs)], serializer=serializer
    )
    data = body if isinstance(body, bytes) else str(body).encode()
    head = "\n".join((task_name, content_type, encoding, json.dumps(options, default=str)))
    return head.encode() + b"\n" + data


def decode_call(task_id: str, payload: bytes) -> tuple[str, HandedCall]:
    """(task name, the call) of a parked call handed its key."""
    task_name, content_type, encoding, options, body = payload.split(b"\n", 4)
    args, kwargs = loads(
        body, content_type.decode(), encoding.decode(), accept={content_type.decode()}
    )
    return task_name.decode(), HandedCall(task_id, tuple(args), dict(kwargs), json.loads(options))


def keep_ms(options: LockOptions) -> int:
    """How long a park queue outlives its last change (ms)."""
    return milliseconds(max(options.queue_timeout, MIN_KEEP))


def mark_parked(task: Any, task_id: str, key: str, position: int) -> None:
    """Store ``PARKED`` (meta: key and position) for ``task_id``, so Flower and
    ``AsyncResult.state`` show it; nothing to store without a result backend."""
    try:
        task.backend.store_result(task_id, {"key": key, "position": position}, PARKED)
    except Exception:
        log.debug("could not store PARKED for %s", task_id, exc_info=True)


def leave_held(run: Run) -> None:
    """The call of ``run``, published again after it was held back in the lock Redis
    (``modes.held``), starts, ends without running (a late copy), or waits elsewhere now
    (parked on its key): the sweep no longer hands it out. Redis errors raise
    ``LockBackendError``."""
    atomic.held_started(run.client, stack_base(run.settings.prefix), run.task_id)


def index_key(client: LockClient, prefix: str, key: str, task_name: str) -> None:
    """Name ``key`` (and its task) in the sweep's list before anything parks there (so a
    crash between the two leaves at most a name the sweep drops), scored by the server's
    second. A process names a key again only after ``INDEX_REFRESH`` seconds: the sweep
    keeps a name younger than ``INDEX_KEEP``, parked calls or not."""
    member = f"{task_name}\n{key}"
    now = time.monotonic()
    if now - _indexed.get(member, -INDEX_REFRESH) < INDEX_REFRESH:
        return
    seconds, _ = (int(part) for part in call(key, client.time))
    call(key, client.zadd, parking_index(prefix), {member: seconds})
    if len(_indexed) >= _INDEXED_MOST:
        _indexed.clear()
    _indexed[member] = now


def priority_rank(app: Any, priority: Any) -> int:
    """Where a Celery ``priority`` puts a call in its key's line (0 first, 255 last), read as
    the app's broker reads it: on Redis 0 is the highest priority, on AMQP 255 is; no
    priority is 0 to both brokers."""
    try:
        number = min(255, max(0, int(priority or 0)))
    except (TypeError, ValueError):
        number = 0
    url = str(app.conf.broker_url or "")
    lowest_first = url.split("://", 1)[0].split("+", 1)[0] in {"redis", "rediss", "sentinel"}
    return number if lowest_first else 255 - number


def take_turn(
    client: LockClient, key: str, task_id: str, *, rank: int, options: LockOptions
) -> int:
    """The turn of call ``task_id`` in the line of ``key``: taken now at the back of its
    rank, or the one it has."""
    return atomic.order_take(
        client, key, task_id, rank=rank, keep_ms=milliseconds(options.queue_timeout)
    )


def turn_of(run: Run) -> int | None:
    """The turn of a delivered call in its key's line: from its message, else taken now
    (it was published with a countdown or ETA, or not through ``apply_async``); None when
    its key's calls run in arrival order."""
    if run.options.order != "enqueue":
        return None
    carried = run.header(HEADER_TURN)
    if carried is not None:
        return int(carried)
    delivery = getattr(run.request, "delivery_info", None) or {}
    rank = priority_rank(run.task.app, delivery.get("priority"))
    return take_turn(run.client, run.key, run.task_id, rank=rank, options=run.options)


def task_of(payload: bytes) -> str:
    """The task name of a parked call's payload."""
    return payload.split(b"\n", 1)[0].decode("utf-8", "replace")
