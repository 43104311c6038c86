"""Typed wrappers of the park scripts (``park*``, see :mod:`.atomic`): a call that finds the
key taken waits in the key's park queue and is handed the key at release.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from celery_singleton_lock.engine.keyspace import DONE, PARKDATA, PARKED, QUEUE, companion_key
from celery_singleton_lock.engine.scripts import SCRIPTS
from celery_singleton_lock.engine.stack import is_stacked
from celery_singleton_lock.engine.wire import LockClient, Record, call, reply_bytes, reply_text

if TYPE_CHECKING:
    from celery_singleton_lock.engine.lock import RedisLock


__all__ = ["Parked", "ParkedCall", "park", "park_release", "park_started", "park_sweep"]

_PARK = SCRIPTS["park"]
_PARK_RELEASE = SCRIPTS["park_release"]
_PARK_SWEEP = SCRIPTS["park_sweep"]
_PARK_STARTED = SCRIPTS["park_started"]


class ParkedCall(NamedTuple):
    """A parked call handed the key, to be published again under ``task_id``: ``payload``
    is what its caller parked (opaque to the engine)."""

    task_id: str
    payload: bytes


class Parked(NamedTuple):
    """What a call under ``park`` came to: ``position`` in the key's park queue (1 is
    next), or None when the key is free and nobody is parked before it (take it as usual);
    ``handed``: the first parked call, which got the free key and must be published."""

    position: int | None
    handed: ParkedCall | None = None


def park(
    client: LockClient,
    key: str,
    task_id: str,
    *,
    turn: float | None,
    token: str,
    info: str,
    payload: bytes,
    keep_ms: int,
    grant_ms: int,
    slots: int = 1,
    ordered: bool = False,
) -> Parked:
    """Park the call ``task_id`` of lock ``key`` while the key is held (or all its slots):
    it joins the park queue at ``turn`` (None: its arrival, server microseconds), kept
    ``keep_ms``; when handed the key it holds it under ``token`` (holder info ``info``) for
    ``grant_ms``. ``token`` and ``info`` must not contain a newline. ``ordered``
    (``lock_order="enqueue"``): the call also parks on a free key while calls before it in
    the key's line (:func:`order_take`) are outstanding."""
    entry = token.encode() + b"\n" + info.encode() + b"\n" + payload
    keys = (key, companion_key(key, PARKED), companion_key(key, PARKDATA))
    score = "" if turn is None else f"{turn:.0f}"
    reply = call(
        key,
        _PARK,
        client,
        3,
        *keys,
        task_id,
        score,
        entry,
        keep_ms,
        grant_ms,
        slots,
        "1" if ordered else "0",
    )
    if int(reply[0]) == 0:
        return Parked(None)
    handed = ParkedCall(reply_text(reply[2]), reply_bytes(reply[3])) if int(reply[0]) == 2 else None
    return Parked(int(reply[1]), handed)


def park_release(
    lock: RedisLock, grant_ms: int, record: Record | None = None, *, ordered: str | None = None
) -> ParkedCall | int:
    """At the end of the run that holds ``lock`` (under ``lock.token``), in one step: hand
    its key (or the slot it holds) to the first parked call, leased ``grant_ms`` under that
    call's grant token, and return it to be published; with nobody parked, release as
    :meth:`RedisLock.release` does and return its reply (1, 2 or 3). 0: not owned, nothing
    done. ``record`` is written in the same step; ``ordered``: the task id of the run,
    which leaves the key's line (``lock_order="enqueue"``). The lock is not detached."""
    token = lock.token
    if token is None:
        return 0
    keys = [lock.held_key, companion_key(lock.name, QUEUE)]
    args: list[bytes | int | str] = [token, grant_ms, lock.limit, "", 0]
    if record is not None:
        done, task_id, keep_ms = record
        keys.append(done)
        args[3:] = [task_id, keep_ms]
    args.append(ordered or "")
    if is_stacked(lock.name):  # ARGV[7]: the ending run's shares of its stacked limits go back
        args.append("1")
    reply = call(lock.name, _PARK_RELEASE, lock.client, len(keys), *keys, *args)
    if int(reply[0]) == 1:
        return ParkedCall(reply_text(reply[1]), reply_bytes(reply[2]))
    return int(reply[1]) if len(reply) > 1 else 0


def park_sweep(
    client: LockClient,
    key: str,
    *,
    restart_ms: int,
    grant_ms: int,
    most: int,
    slots: int = 1,
    ordered: bool = False,
) -> tuple[bool, list[ParkedCall]]:
    """Sweep the park queue of lock ``key``: the calls handed the key more than
    ``restart_ms`` ago that did not start (to publish again), and, when the key (a slot)
    is free, the first parked calls, now holding it (``ordered``: when their turn has
    come). Also whether anything is still parked, handed off or in line there."""
    reply = call(
        key, _PARK_SWEEP, client, 1, key, restart_ms, grant_ms, most, slots, "1" if ordered else "0"
    )
    calls = [
        ParkedCall(reply_text(reply[index]), reply_bytes(reply[index + 1]))
        for index in range(1, len(reply), 2)
    ]
    return int(reply[0]) == 1, calls


def park_started(client: LockClient, key: str, task_id: str) -> int:
    """The call ``task_id``, handed the key from the park queue, starts: the sweep lets it
    be. 1 when it was a handed-off call, 0 when not, -1 when a run of that task id finished
    already under the key (a late copy: it must not run)."""
    keys = (key, companion_key(key, DONE))
    return int(call(key, _PARK_STARTED, client, 2, *keys, task_id))
