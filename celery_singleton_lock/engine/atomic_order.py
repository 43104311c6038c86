"""Typed wrappers of the ordering scripts (``order_*``, see :mod:`.atomic`): the line of
turns of ``lock_order="enqueue"``.
"""

from __future__ import annotations

from celery_singleton_lock.engine.keyspace import DONE, companion_key
from celery_singleton_lock.engine.scripts import SCRIPTS
from celery_singleton_lock.engine.wire import LockClient, call

__all__ = ["order_leave", "order_take", "order_turn"]

_ORDER_TAKE = SCRIPTS["order_take"]
_ORDER_TURN = SCRIPTS["order_turn"]
_ORDER_LEAVE = SCRIPTS["order_leave"]

#: Turns of one priority are this far apart from the next priority's (2**36 calls).
_PRIORITY_STEP = 2**36


def order_take(client: LockClient, key: str, task_id: str, *, rank: int, keep_ms: int) -> int:
    """The turn of call ``task_id`` in the line of lock ``key`` (``lock_order="enqueue"``):
    the next number of the key's counter, behind every call of a lower ``rank`` (0-255,
    0 first); a call already in the line keeps its turn. It stays in the line at most
    ``keep_ms`` unless it is delivered (:func:`order_turn`)."""
    if not 0 <= rank <= 255:
        raise ValueError(f"rank must be 0-255, got {rank}")
    return int(call(key, _ORDER_TAKE, client, 1, key, task_id, rank, keep_ms))


def order_turn(
    client: LockClient,
    key: str,
    task_id: str,
    *,
    turn: int,
    slots: int,
    keep_ms: int,
    lease_ms: int,
) -> int:
    """At delivery: 1 when the turn of ``task_id`` has come (it is one of the first
    ``slots`` outstanding calls of the key), 0 when a call before it is outstanding (it
    parks, keeping its place ``keep_ms``), -1 when it finished already (a late copy). A
    call that goes ahead keeps its place ``lease_ms`` unless it finishes."""
    keys = (key, companion_key(key, DONE))
    return int(call(key, _ORDER_TURN, client, 2, *keys, task_id, turn, slots, keep_ms, lease_ms))


def order_leave(client: LockClient, key: str, task_id: str) -> bool:
    """Call ``task_id`` leaves the line of ``key`` without running (revoked, dropped).
    Whether it was in the line."""
    return int(call(key, _ORDER_LEAVE, client, 1, key, task_id)) == 1
