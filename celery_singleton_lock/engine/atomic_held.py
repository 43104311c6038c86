"""Typed wrappers of the success-hold scripts (``held_*``, see :mod:`.atomic`): calls that
wait out a key held after a success, and their release when the hold ends.
"""

from __future__ import annotations

from typing import NamedTuple

from celery_singleton_lock.engine.scripts import SCRIPTS
from celery_singleton_lock.engine.stack import (
    HELD,
    HELD_CALLS,
    HELD_OUT,
    HELD_WAKE,
    Stack,
)
from celery_singleton_lock.engine.wire import LockClient, call, reply_bytes, reply_text

__all__ = ["HeldCall", "HeldSweep", "held_park", "held_started", "held_sweep"]

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
    return reply_text(reply[1]) if int(reply[0]) == 1 else None


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
        HeldCall(
            reply_text(reply[index]), reply_text(reply[index + 1]), reply_bytes(reply[index + 2])
        )
        for index in range(2, len(reply), 3)
    ]
    return HeldSweep(int(reply[0]) == 1, None if due < 0 else due / 1000, calls)


def held_started(client: LockClient, base: str, task_id: str) -> bool:
    """The held-back call ``task_id`` starts (or ended without running, or waits elsewhere
    now): the sweep lets it be, and its places in the lines go. Whether it was held back or
    handed out."""
    return int(call(base, _HELD_STARTED, client, 3, *_held_keys(base), task_id)) == 1
