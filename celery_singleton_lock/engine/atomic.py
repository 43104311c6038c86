"""Typed wrappers of the modes' scripts: each one atomic step on the server that reads or
writes a lock value or a fencing token, so that only the engine does (the Celery side
calls these and never builds a value or packs script arguments itself).

Every wrapper is one EVALSHA (or, for :func:`superseded_by`, one GET) through
:func:`.wire.call`, so a redis-py error surfaces as ``LockBackendError``; every key is a
companion of the lock key (:mod:`.keyspace`), in its Redis Cluster hash slot. Each script's
KEYS / ARGV / reply contract heads its file in ``scripts/``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from celery_singleton_lock.engine.keyspace import (
    BURST,
    DEBOUNCE,
    DONE,
    PENDING,
    QUEUE,
    STARTS,
    SUPERSEDED,
    companion_key,
)
from celery_singleton_lock.engine.scripts import SCRIPTS
from celery_singleton_lock.engine.wire import LockClient, call

if TYPE_CHECKING:
    from celery_singleton_lock.engine.lock import RedisLock

__all__ = [
    "Burst",
    "Followed",
    "Handed",
    "Pending",
    "Record",
    "debounce_join",
    "debounce_run",
    "follow",
    "hand_over",
    "hold",
    "replace",
    "superseded_by",
    "throttle",
]

#: ``(done set, task id, keep ms)``: in the same atomic step, the task id is recorded as
#: finished in the lock's done set (``keyspace.DONE``), kept that long, as a release does.
Record = tuple[str, str, int]

_THROTTLE = SCRIPTS["throttle"]
_HOLD = SCRIPTS["hold"]
_CALL = SCRIPTS["followup_call"]
_HAND_OVER = SCRIPTS["followup_hand_over"]
_REPLACE = SCRIPTS["followup_replace"]
_JOIN = SCRIPTS["debounce_join"]
_RUN = SCRIPTS["debounce_run"]

_CALL_OUTCOMES = {0: "take", 1: "follow", 2: "adopt"}
_REPLACE_OUTCOMES = {0: "take", 1: "superseded", 2: "follow", 3: "revoke"}


def _text(part: Any) -> str:
    return part.decode() if isinstance(part, bytes) else str(part)


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


class Pending(NamedTuple):
    """The call a coalesce or replace follow-up would become: its task id, the owner token
    and holder info of its queue lock, the serialized call (``body``, ``content_type``,
    ``encoding``), its kept publish ``options`` (JSON) and how long a follow-up is kept."""

    task_id: str
    token: str
    info: str
    body: bytes
    content_type: str
    encoding: str
    options: str
    keep_ms: int


class Followed(NamedTuple):
    """What a call under coalesce (:func:`follow`) or replace (:func:`replace`) came to.

    ``outcome``: ``"take"`` the lock is free: acquire as usual; ``"follow"`` the call is
    (now) the follow-up ``task_id`` of the holder; ``"adopt"`` the lock is free but a
    follow-up ``task_id`` was left behind: take the lock for it and publish under it;
    ``"superseded"`` the queued holder ``task_id`` was superseded: the lock is the call's
    now; ``"revoke"``: the call is (now) the follow-up ``task_id`` of the running
    ``holder``, which is to be revoked.
    """

    outcome: str
    task_id: str | None
    holder: str | None = None


def _pending_args(pending: Pending) -> tuple[bytes | int | str, ...]:
    return (
        pending.task_id,
        pending.token,
        pending.info,
        pending.body,
        pending.content_type,
        pending.encoding,
        pending.options,
        pending.keep_ms,
    )


def _followed(reply: Any, outcomes: dict[int, str], *, holder: bool = False) -> Followed:
    return Followed(
        outcomes[int(reply[0])],
        _text(reply[1]) if len(reply) > 1 else None,
        _text(reply[2]) if holder and len(reply) > 2 else None,
    )


def follow(client: LockClient, key: str, pending: Pending) -> Followed:
    """Coalesce: while lock ``key`` is held, ``pending`` becomes (or updates) its
    follow-up; see :class:`Followed` for the outcomes."""
    reply = call(key, _CALL, client, 2, key, companion_key(key, PENDING), *_pending_args(pending))
    return _followed(reply, _CALL_OUTCOMES)


def replace(
    client: LockClient, key: str, pending: Pending, *, running: bool, lease_ms: int
) -> Followed:
    """Replace: a queued holder of lock ``key`` is superseded by ``pending``, whose queue
    lock takes the key at once for ``lease_ms`` (a new fencing token); a running holder
    gets ``pending`` as its follow-up (outcome ``"revoke"`` when ``running`` asks for the
    holder, named in ``holder``, to be revoked; the key is not taken from it)."""
    reply = call(
        key,
        _REPLACE,
        client,
        2,
        key,
        companion_key(key, PENDING),
        *_pending_args(pending),
        b"1" if running else b"0",
        lease_ms,
    )
    return _followed(reply, _REPLACE_OUTCOMES, holder=True)


class Handed(NamedTuple):
    """A follow-up the lock was just handed to, to be published under ``task_id``."""

    task_id: str
    body: bytes
    content_type: str
    encoding: str
    options: str


def hand_over(lock: RedisLock, lease_ms: int, record: Record | None = None) -> Handed | int:
    """At the end of the run that holds ``lock`` (under ``lock.token``), in one step: give
    the lock to the pending follow-up, leased for ``lease_ms`` under its queue token (a new
    fencing token), and return it; with no follow-up, release the lock as
    :meth:`RedisLock.release` does (waiters served) and return its reply (1, 2 or 3). 0:
    not owned (or ``lock.token`` is None), nothing done. ``record`` is written in the same
    step. The lock is not detached: that is the caller's move."""
    token = lock.token
    if token is None:
        return 0
    keys = [lock.name, companion_key(lock.name, QUEUE), companion_key(lock.name, PENDING)]
    args: list[bytes | int | str] = [token, lease_ms]
    if record is not None:
        where, value, ttl_ms = record
        keys.append(where)
        args += [value, ttl_ms]
    reply = call(lock.name, _HAND_OVER, lock.client, len(keys), *keys, *args)
    if int(reply[0]) != 1:
        return int(reply[1]) if len(reply) > 1 else 0
    task_id, body, content_type, encoding, options = reply[1:]
    data = body if isinstance(body, bytes) else str(body).encode()
    return Handed(_text(task_id), data, _text(content_type), _text(encoding), _text(options))


def superseded_by(client: LockClient, key: str, task_id: str) -> str | None:
    """The task id that superseded ``task_id``'s queued call of lock ``key``, if any."""
    found = call(key, client.get, companion_key(key, SUPERSEDED + task_id))
    return None if found is None else _text(found)


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
    return Burst(_text(reply[0]), int(reply[1]), max(0.0, int(reply[2]) / 1000))


def debounce_run(
    client: LockClient, key: str, burst_id: str, generation: str, *, keep_ms: int
) -> bool:
    """At delivery: whether the message of ``generation`` of burst ``burst_id`` is the
    burst's latest call and the burst has not finished (then it runs; a retry or a
    redelivery of it runs too). With the burst's record lost, the first message delivered
    wins (its record is recreated, kept ``keep_ms``)."""
    keys = (companion_key(key, BURST + burst_id), companion_key(key, DONE))
    return int(call(key, _RUN, client, 2, *keys, burst_id, generation, keep_ms)) == 1
