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
    HANDED,
    PARKDATA,
    PARKED,
    PENDING,
    QUEUE,
    STARTS,
    SUPERSEDED,
    companion_key,
)
from celery_singleton_lock.engine.scripts import SCRIPTS
from celery_singleton_lock.engine.stack import (
    HELD,
    HELD_CALLS,
    HELD_OUT,
    HELD_WAKE,
    Stack,
    is_stacked,
)
from celery_singleton_lock.engine.wire import LockClient, call

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
        _text(task_id),
        data,
        _text(content_type),
        _text(encoding),
        _text(options),
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


_STACK_LINE = SCRIPTS["stack_line"]


def stack_line(client: LockClient, key: str, stack: Stack, place: str, keep_ms: int) -> str | None:
    """A call of lock ``key`` held back by ``stack`` that will come back as another delivery
    (claiming with the token ``place``) keeps its place in the line of every limit it does
    not fit in, for ``keep_ms``: the name of the first such limit, or None when it fits now
    (no place taken: try again at once)."""
    reply = call(key, _STACK_LINE, client, 1, key, stack.spec(), place, keep_ms)
    text = _text(reply)
    return text or None


_PARK = SCRIPTS["park"]
_PARK_RELEASE = SCRIPTS["park_release"]
_PARK_SWEEP = SCRIPTS["park_sweep"]
_PARK_STARTED = SCRIPTS["park_started"]
_ORDER_TAKE = SCRIPTS["order_take"]
_ORDER_TURN = SCRIPTS["order_turn"]
_ORDER_LEAVE = SCRIPTS["order_leave"]
_INDEX_DROP = SCRIPTS["index_drop"]


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


def _bytes(part: Any) -> bytes:
    return part if isinstance(part, bytes) else str(part).encode()


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
    handed = ParkedCall(_text(reply[2]), _bytes(reply[3])) if int(reply[0]) == 2 else None
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
        return ParkedCall(_text(reply[1]), _bytes(reply[2]))
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
        ParkedCall(_text(reply[index]), _bytes(reply[index + 1]))
        for index in range(1, len(reply), 2)
    ]
    return int(reply[0]) == 1, calls


def park_started(client: LockClient, key: str, task_id: str) -> int:
    """The call ``task_id``, handed the key from the park queue, starts: the sweep lets it
    be. 1 when it was a handed-off call, 0 when not, -1 when a run of that task id finished
    already under the key (a late copy: it must not run)."""
    keys = (key, companion_key(key, DONE))
    return int(call(key, _PARK_STARTED, client, 2, *keys, task_id))


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


def index_drop(client: LockClient, index: str, member: str, *, before: int) -> bool:
    """``member`` leaves the sorted set ``index`` unless its score (a server second) is
    ``before`` or later: it was named again lately. Whether it left."""
    return int(call(index, _INDEX_DROP, client, 1, index, member, before)) == 1


_HELD_PARK = SCRIPTS["held_park"]
_HELD_SWEEP = SCRIPTS["held_sweep"]
_HELD_STARTED = SCRIPTS["held_started"]


def _held_keys(base: str) -> tuple[str, str, str]:
    return base + HELD, base + HELD_CALLS, base + HELD_OUT


def held_park(
    client: LockClient,
    base: str,
    task_id: str,
    *,
    key: str,
    payload: bytes,
    keep_ms: int,
    due_ms: int = 0,
    stack: Stack | None = None,
    place: str = "",
    place_ms: int = 0,
) -> str | None:
    """Keep the call ``task_id`` of lock ``key`` (``payload``: what its caller keeps, opaque
    to the engine) in the lock Redis under the stack base
    ``base`` (kept ``keep_ms``) until it fits: held back by ``stack`` (its places in the
    lines of the limits it does not fit in kept ``place_ms`` under the token ``place``, in
    the same step that finds it still does not fit), or by its rate for ``due_ms``. The
    name of the first limit it does not fit in ("" for a rate); None when it fits now
    (nothing kept: try again at once). ``key`` and ``place`` must not contain a newline."""
    if "\n" in key or "\n" in place:
        raise ValueError("a held call's key and place token cannot contain a newline")
    spec = stack.spec() if stack is not None else ""
    reply = call(
        base,
        _HELD_PARK,
        client,
        4,
        *_held_keys(base),
        base + HELD_WAKE,
        task_id,
        due_ms,
        key,
        payload,
        keep_ms,
        spec,
        place,
        place_ms,
        "1" if due_ms else "0",
    )
    return _text(reply[1]) if int(reply[0]) == 1 else None


class HeldCall(NamedTuple):
    """A held-back call handed out to be published under ``task_id``: the ``key`` it locks
    and ``payload``, what its caller kept (opaque to the engine)."""

    task_id: str
    key: str
    payload: bytes


class HeldSweep(NamedTuple):
    """What a sweep of the held-back calls found: whether calls are still held or handed
    out, the seconds until the next one is due (None: none is waiting for a time), and the
    calls handed out now, to publish."""

    active: bool
    next_due: float | None
    calls: list[HeldCall]


def held_sweep(
    client: LockClient,
    base: str,
    *,
    restart_ms: int,
    place_ms: int,
    travel_ms: int,
    most: int,
    tasks: tuple[str, ...] = (),
) -> HeldSweep:
    """Sweep the calls held back under the stack base ``base``: those handed out more than
    ``restart_ms`` ago that did not start, and those due whose stack fits now (with room
    for the waiters ahead of them), are handed out (their places kept ``travel_ms``); the
    others keep their places ``place_ms``. At most ``most`` of each; only calls of
    ``tasks`` (their task names, none with a newline; empty: all)."""
    reply = call(
        base,
        _HELD_SWEEP,
        client,
        3,
        *_held_keys(base),
        restart_ms,
        place_ms,
        travel_ms,
        most,
        "\n".join(tasks),
    )
    due = int(reply[1])
    calls = [
        HeldCall(_text(reply[index]), _text(reply[index + 1]), _bytes(reply[index + 2]))
        for index in range(2, len(reply), 3)
    ]
    return HeldSweep(int(reply[0]) == 1, None if due < 0 else due / 1000, calls)


def held_started(client: LockClient, base: str, task_id: str) -> bool:
    """The held-back call ``task_id`` starts (or ended without running, or waits elsewhere
    now): the sweep lets it be, and its places in the lines go. Whether it was held back or
    handed out."""
    return int(call(base, _HELD_STARTED, client, 3, *_held_keys(base), task_id)) == 1
