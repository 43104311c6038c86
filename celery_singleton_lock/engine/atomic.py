"""Typed wrappers of the modes' scripts: each one atomic step on the server that reads or
writes a lock value or a fencing token, so that only the engine does (the Celery side
calls these and never builds a value or packs script arguments itself).

Every wrapper is one EVALSHA (or, for :func:`superseded_by`, one GET) through
:func:`.wire.call`, so a redis-py error surfaces as ``LockBackendError``; every key is a
companion of the lock key (:mod:`.keyspace`), in its Redis Cluster hash slot. Each script's
KEYS / ARGV / reply contract heads its file in ``scripts/``.

The wrappers of one mode's scripts live beside this module (:mod:`.atomic_followup`,
:mod:`.atomic_park`, :mod:`.atomic_order`, :mod:`.atomic_held`); every name is re-exported
here, so callers write ``atomic.park`` whatever module holds it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from celery_singleton_lock.engine.atomic_followup import (
    HANDED_KEEP_MS,
    Followed,
    Handed,
    Pending,
    adopt,
    follow,
    hand_over,
    replace,
    superseded_by,
)
from celery_singleton_lock.engine.atomic_held import (
    HeldCall,
    HeldSweep,
    held_park,
    held_started,
    held_sweep,
)
from celery_singleton_lock.engine.atomic_order import order_leave, order_take, order_turn
from celery_singleton_lock.engine.atomic_park import (
    Parked,
    ParkedCall,
    park,
    park_release,
    park_started,
    park_sweep,
)
from celery_singleton_lock.engine.keyspace import BURST, DEBOUNCE, DONE, STARTS, companion_key
from celery_singleton_lock.engine.scripts import SCRIPTS
from celery_singleton_lock.engine.stack import Stack
from celery_singleton_lock.engine.wire import LockClient, Record, call, reply_text

if TYPE_CHECKING:
    from celery_singleton_lock.engine.lock import RedisLock

__all__ = [
    "HANDED_KEEP_MS",
    "Burst",
    "Followed",
    "Handed",
    "HeldCall",
    "HeldSweep",
    "Parked",
    "ParkedCall",
    "Pending",
    "Record",
    "adopt",
    "debounce_join",
    "debounce_run",
    "follow",
    "hand_over",
    "held_park",
    "held_started",
    "held_sweep",
    "hold",
    "index_drop",
    "order_leave",
    "order_take",
    "order_turn",
    "park",
    "park_release",
    "park_started",
    "park_sweep",
    "replace",
    "stack_line",
    "superseded_by",
    "throttle",
]

_THROTTLE = SCRIPTS["throttle"]
_HOLD = SCRIPTS["hold"]
_JOIN = SCRIPTS["debounce_join"]
_RUN = SCRIPTS["debounce_run"]
_STACK_LINE = SCRIPTS["stack_line"]
_INDEX_DROP = SCRIPTS["index_drop"]


def throttle(
    client: LockClient, key: str, *, limit: int, window_ms: int, member: str
) -> float | None:
    """Admit a start of lock ``key`` if fewer than ``limit`` starts fall in the last
    ``window_ms`` (server clock), recording it as ``member`` (the server time is appended):
    None when admitted and recorded, else the seconds until a start would be admitted."""
    reply = call(key, _THROTTLE, client, 1, companion_key(key, STARTS), limit, window_ms, member)
    return None if int(reply[0]) == 1 else int(reply[1]) / 1000


def throttle_wait(client: LockClient, key: str, *, limit: int, window_ms: int) -> float:
    """Seconds until a start of lock ``key`` would be admitted (0: now), recording nothing."""
    reply = call(key, _THROTTLE, client, 1, companion_key(key, STARTS), limit, window_ms, "")
    return 0.0 if int(reply[0]) == 1 else int(reply[1]) / 1000


def hold(lock: RedisLock, hold_ms: int, info: str, record: Record | None = None) -> int:
    """Turn the hold of ``lock.token`` on its key (the lock key, or the slot it took) into a
    hold of ``hold_ms`` from the server's now that nobody renews (same owner token and
    fencing token, waiters' flag kept), with holder info ``info``; ``record`` is written in
    the same step. The end of
    the hold (server ms), or 0 when not owned or ``lock.token`` is None (nothing done).
    The lock is not detached: that is the caller's move."""
    token = lock.token
    if token is None:
        return 0
    key = lock.held_key  # with slots, the slot this hold took
    if record is None:
        reply = call(lock.name, _HOLD, lock.client, 1, key, token, hold_ms, info)
    else:
        done, task_id, keep_ms = record
        reply = call(
            lock.name, _HOLD, lock.client, 2, key, done, token, hold_ms, info, task_id, keep_ms
        )
    return int(reply)


class Burst(NamedTuple):
    """Where one debounced call went: the burst's task id, this call's generation in it,
    and the seconds until the burst's run is due."""

    task_id: str
    generation: int
    countdown: float


def debounce_join(
    client: LockClient, key: str, task_id: str, *, quiet_ms: int, max_wait_ms: int, keep_ms: int
) -> Burst:
    """Add the call ``task_id`` to the open burst of lock ``key``, or open one: the burst
    runs ``quiet_ms`` after its last call, at most ``max_wait_ms`` after its first (0: no
    limit); its records are kept ``keep_ms`` past its due time."""
    keys = (companion_key(key, DEBOUNCE), companion_key(key, DONE))
    reply = call(key, _JOIN, client, 2, *keys, task_id, quiet_ms, max_wait_ms, keep_ms)
    return Burst(reply_text(reply[0]), int(reply[1]), max(0.0, int(reply[2]) / 1000))


def debounce_run(
    client: LockClient, key: str, burst_id: str, generation: str, *, keep_ms: int
) -> bool:
    """At delivery: whether the message of ``generation`` of burst ``burst_id`` is the
    burst's latest call and the burst has not finished (then it runs; a retry or a
    redelivery of it runs too). With the burst's record lost, the first message delivered
    wins (its record is recreated, kept ``keep_ms``)."""
    keys = (companion_key(key, BURST + burst_id), companion_key(key, DONE))
    return int(call(key, _RUN, client, 2, *keys, burst_id, generation, keep_ms)) == 1


def stack_line(client: LockClient, key: str, stack: Stack, place: str, keep_ms: int) -> str | None:
    """A call of lock ``key`` held back by ``stack`` that will come back as another delivery
    (claiming with the token ``place``) keeps its place in the line of every limit it does
    not fit in, for ``keep_ms``: the name of the first such limit, or None when it fits now
    (no place taken: try again at once)."""
    reply = call(key, _STACK_LINE, client, 1, key, stack.spec(), place, keep_ms)
    text = reply_text(reply)
    return text or None


def index_drop(client: LockClient, index: str, member: str, *, before: int) -> bool:
    """``member`` leaves the sorted set ``index`` unless its score (a server second) is
    ``before`` or later: it was named again lately. Whether it left."""
    return int(call(index, _INDEX_DROP, client, 1, index, member, before)) == 1
