"""Typed wrappers of the follow-up scripts (``followup_*``, see :mod:`.atomic`): a call
queued behind the running one, its hand-over at release and its adoption after a lost reply.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from celery_singleton_lock.engine.keyspace import HANDED, PENDING, QUEUE, SUPERSEDED, companion_key
from celery_singleton_lock.engine.scripts import SCRIPTS
from celery_singleton_lock.engine.stack import is_stacked
from celery_singleton_lock.engine.wire import LockClient, Record, call, reply_text

if TYPE_CHECKING:
    from celery_singleton_lock.engine.lock import RedisLock


__all__ = [
    "HANDED_KEEP_MS",
    "Followed",
    "Handed",
    "Pending",
    "adopt",
    "follow",
    "hand_over",
    "replace",
    "superseded_by",
]

_CALL = SCRIPTS["followup_call"]
_HAND_OVER = SCRIPTS["followup_hand_over"]
_REPLACE = SCRIPTS["followup_replace"]

_CALL_OUTCOMES = {0: "take", 1: "follow", 2: "adopt"}
_REPLACE_OUTCOMES = {0: "take", 1: "superseded", 2: "follow", 3: "revoke"}


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
        reply_text(reply[1]) if len(reply) > 1 else None,
        reply_text(reply[2]) if holder and len(reply) > 2 else None,
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
    """A follow-up the lock was just handed to, to be published under ``task_id``.
    ``adopted``: it was left behind beside a free lock (its holder never handed it over),
    not handed by the run that ends."""

    task_id: str
    body: bytes
    content_type: str
    encoding: str
    options: str
    adopted: bool = False


#: How long a hand-over keeps the call it handed (ms), for a retry whose reply was lost.
HANDED_KEEP_MS = 120_000


def _hand_over(
    client: LockClient, name: str, token: str, *, fence: int, lease_ms: int, record: Record | None
) -> Handed | int:
    keys = [
        name,
        companion_key(name, QUEUE),
        companion_key(name, PENDING),
        companion_key(name, HANDED),
    ]
    args: list[bytes | int | str] = [token, lease_ms, HANDED_KEEP_MS, fence]
    if record is not None:
        where, value, ttl_ms = record
        keys.append(where)
        args += [value, ttl_ms]
    if is_stacked(name):  # ARGV[7]: the ending run's shares of its stacked limits go back
        if record is None:
            args += ["", 0]
        args.append("1")
    reply = call(name, _HAND_OVER, client, len(keys), *keys, *args)
    code = int(reply[0])
    if code == 0:
        return -int(reply[1]) if len(reply) > 1 else 0
    if code == 2:
        return int(reply[1])
    task_id, body, content_type, encoding, options = reply[1:6]
    data = body if isinstance(body, bytes) else str(body).encode()
    return Handed(
        reply_text(task_id),
        data,
        reply_text(content_type),
        reply_text(encoding),
        reply_text(options),
        adopted=code == 3,
    )


def hand_over(lock: RedisLock, lease_ms: int, record: Record | None = None) -> Handed | int:
    """At the end of the run that holds ``lock`` (under ``lock.token``), in one step: give
    the lock to the pending follow-up, leased for ``lease_ms`` under its queue token (a new
    fencing token), and return it; with no follow-up, release the lock as
    :meth:`RedisLock.release` does (waiters served) and return its reply (1, 2 or 3). 0 or
    less: not owned (or ``lock.token`` is None), nothing to do. Safe to call again after an
    error that may have lost the reply: the follow-up it handed is returned again. A
    follow-up left behind beside a free lock is handed over too (``Handed.adopted``).
    ``record`` is written in the same step. The lock is not detached: that is the caller's
    move."""
    token = lock.token
    if token is None:
        return 0
    return _hand_over(
        lock.client,
        lock.name,
        token,
        fence=lock.fencing_token or 0,
        lease_ms=lease_ms,
        record=record,
    )


def adopt(client: LockClient, key: str, lease_ms: int) -> tuple[bool, Handed | None]:
    """For the worker sweep: hand lock ``key``, when free, to a follow-up left behind (its
    holder died without handing over, or its hand-over failed until its lease ran out).
    Returns (whether a follow-up still waits for the key, the follow-up handed over)."""
    found = _hand_over(client, key, "", fence=0, lease_ms=lease_ms, record=None)
    if isinstance(found, Handed):
        return False, found
    return found < 0, None


def superseded_by(client: LockClient, key: str, task_id: str) -> str | None:
    """The task id that superseded ``task_id``'s queued call of lock ``key``, if any."""
    found = call(key, client.get, companion_key(key, SUPERSEDED + task_id))
    return None if found is None else reply_text(found)
