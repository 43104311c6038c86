"""A parked call as data: the result state and headers that mark it, how the park queue
keeps a call (what publishing it again needs), the sweep's list of keys with parked calls,
and a call's turn in its key's line (``lock_order="enqueue"``). :mod:`.park` decides when
a call parks and hands keys over; :mod:`.order` keeps turns; this module only names and
encodes, and shows the park's state in an explanation (:class:`ParkFace`)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from kombu.serialization import dumps, loads

from celery_singleton_lock.engine import atomic, keyspace
from celery_singleton_lock.engine.keyspace import companion_key
from celery_singleton_lock.engine.stack import stack_base
from celery_singleton_lock.engine.wire import call
from celery_singleton_lock.modes.base import HandedCall
from celery_singleton_lock.modes.face import (
    Asked,
    Face,
    Lines,
    fields,
    holder_info,
    listed,
    seconds,
    since,
    text,
    who,
)

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
    "Handed",
    "ParkFace",
    "Parked",
    "decode_call",
    "encode_call",
    "handed_hold",
    "index_key",
    "keep_ms",
    "leave_held",
    "mark_parked",
    "milliseconds",
    "parked_count",
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


def ordered(options: LockOptions) -> bool:
    """Whether a key's calls take turns in its line (``lock_order="enqueue"``), rather than
    run in the order their messages arrive: the one place the park queue asks."""
    return options.order == "enqueue"


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
    if not ordered(run.options):
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


# ----------------------------------------------------------------------- the park's face


@dataclass(frozen=True)
class Parked:
    """A call parked on the key (``lock_on_conflict="park"``), ``position`` 1 being the
    next to be handed the key; ``since``: when it parked (server time, Unix seconds)."""

    position: int
    task_id: str
    task: str | None = None
    since: float | None = None
    waited: float | None = None

    def describe(self) -> str:
        text = f"{self.position}. {who(self.task, self.task_id, None, None)}"
        return text + (f", parked {seconds(self.waited)}" if self.waited is not None else "")


@dataclass(frozen=True)
class Handed:
    """A parked call that was handed the key ``age`` seconds ago and has not started."""

    task_id: str
    since: float | None = None
    age: float | None = None

    def describe(self) -> str:
        return f"[{self.task_id}] handed the key {seconds(self.age)} ago, not started yet"


class ParkFace(Face):
    """The park queue ``<base>parked`` (task ids scored by when they parked, in turn
    order), each call's record in ``<base>parkdata`` (``<grant token>\\n<holder
    info>\\n<the call>``: the task name is read from the holder info) and the calls handed
    the key ``<base>granted``: ``parked``, ``parked_total``, ``handed``; state
    ``parked``."""

    suffixes = (keyspace.PARKED, keyspace.PARKDATA, keyspace.GRANTED)
    states = ("parked",)
    fields = ("parked", "parked_total", "handed")

    def first(self, asked: Asked, pipe: Any) -> None:
        pipe.zrange(asked.companion(keyspace.PARKED), 0, asked.most - 1, withscores=True)
        pipe.zcard(asked.companion(keyspace.PARKED))
        pipe.zrange(asked.companion(keyspace.GRANTED), 0, asked.most - 1, withscores=True)

    def second(self, asked: Asked, first: list[Any], pipe: Any) -> None:
        parked = first[0]
        if parked:
            pipe.hmget(asked.companion(keyspace.PARKDATA), [text(id_) for id_, _ in parked])

    def parts(self, asked: Asked, first: list[Any], second: list[Any]) -> dict[str, Any]:
        parked, total, granted = first
        entries = second[0] if second else [None] * len(parked)
        found = []
        for position, ((task_id, score), entry) in enumerate(
            zip(parked, entries, strict=True), start=1
        ):
            info: dict[str, Any] = {}
            if isinstance(entry, bytes):
                pieces = entry.split(b"\n", 2)
                info = holder_info(text(pieces[1])) if len(pieces) > 1 else {}
            at, waited = since(float(score), asked.now_us)
            found.append(Parked(position, text(task_id) or "", text(info.get("task")), at, waited))
        handed = tuple(
            Handed(text(task_id) or "", *since(float(score) * 1000, asked.now_us))
            for task_id, score in granted
        )
        return {"parked": tuple(found), "parked_total": int(total), "handed": handed}

    def state_of(self, explanation: Any) -> tuple[str, ...]:
        return ("parked",) if explanation.parked_total or explanation.handed else ()

    def lines(self, explanation: Any) -> Lines:
        lines: Lines = []
        listed(lines, "Parked", explanation.parked_total, explanation.parked, "parked")
        lines.extend(("Handed", handed.describe()) for handed in explanation.handed)
        return lines

    def as_json(self, explanation: Any) -> dict[str, Any]:
        return {
            "parked": [fields(parked) for parked in explanation.parked],
            "parked_total": explanation.parked_total,
            "handed": [fields(handed) for handed in explanation.handed],
        }

    def from_json(self, data: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "parked": tuple(Parked(**parked) for parked in data.get("parked") or ()),
            "parked_total": int(data.get("parked_total", 0)),
            "handed": tuple(Handed(**handed) for handed in data.get("handed") or ()),
        }


def handed_hold(info: Mapping[str, Any]) -> bool:
    """Whether a hold's holder info marks a key handed to a parked call (not started yet),
    as :meth:`.park.Park` writes it."""
    return info.get("parked") is True


def parked_count(client: LockClient, key: str) -> int:
    """How many calls are parked on lock ``key`` (``celery locks list``)."""
    return int(cast("Any", client).zcard(companion_key(key, keyspace.PARKED)))
