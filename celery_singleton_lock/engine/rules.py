"""The lock's rules that involve no I/O, defined once for both engines: ``RedisLock``
(:mod:`.lock`) and ``AsyncRedisLock`` (:mod:`.aio`) call these, so they validate the same
arguments the same way, wait by the same arithmetic, pick the hold a call is about by the
same rule and read the same answers from the server. Nothing here talks to Redis.
"""

from __future__ import annotations

import json
import math
import socket
import time
from collections.abc import Callable, Collection, Iterable
from enum import Enum
from typing import Any, NamedTuple

import redis

from celery_singleton_lock.engine.constants import MAX_DURATION, MAX_LIMIT
from celery_singleton_lock.engine.holds import Hold
from celery_singleton_lock.engine.keyspace import SLOT, companion_key
from celery_singleton_lock.engine.value import Holder, LockValue, parse_value
from celery_singleton_lock.exceptions import LockLost, LockNotOwned

__all__ = [
    "AT_MOST",
    "BLPOP_MARGIN",
    "MIN_WAIT",
    "SOCKET_SHARE",
    "TIMER_SLACK",
    "Next",
    "Step",
    "acquire_mode",
    "check_lock",
    "ensure_held",
    "fair_ms",
    "hold_for",
    "holder_at",
    "holder_text",
    "holders_at",
    "lease_ms",
    "newest",
    "next_step",
    "owns",
    "poll_cap",
    "reply_lost",
    "slot_held_by",
    "slot_key",
    "slot_number",
    "slot_numbers",
    "value_of",
    "wait_for",
]

#: Added to a holder's remaining lease before trying again, so we arrive just after it ends.
MIN_WAIT = 0.001
#: How late Redis may time out a BLPOP: it checks on its timer tick (hz 10 = every 0.1 s).
TIMER_SLACK = 0.11
#: Waits shorter than the slack plus this are slept in the client instead of in BLPOP.
BLPOP_MARGIN = 0.04
#: A BLPOP must return before the client's socket timeout: use at most this share of it.
SOCKET_SHARE = 0.8

#: How the upper bound of every duration reads in an error message.
AT_MOST = f"at most {MAX_DURATION} (365 days)"


# -- arguments ------------------------------------------------------------------------------


#: Valid leases already converted (seconds -> ms): a lock is built per task run.
_LEASES: dict[object, int] = {}


def lease_ms(value: object, what: str) -> int:
    """Validate a lease in seconds (positive, finite, at most ``MAX_DURATION``: beyond it the
    expiry a lock value stores would leave the value grammar) and return it in milliseconds."""
    kind = type(value)
    if kind is float or kind is int:
        known = _LEASES.get(value)
        if known is not None:
            return known
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be a positive number of seconds, got {value!r}")
    try:
        seconds = float(value)
    except OverflowError:  # an int too big for a float
        seconds = math.inf
    if not math.isfinite(seconds) or seconds <= 0 or seconds > MAX_DURATION:
        raise ValueError(f"{what} must be a positive number of seconds, {AT_MOST}, got {value!r}")
    ms = max(1, round(seconds * 1000))
    if (kind is float or kind is int) and len(_LEASES) < 1024:
        _LEASES[value] = ms
    return ms


def check_lock(
    name: object,
    timeout: object,
    *,
    scripting: bool,
    fallback_poll: object,
    token: object,
    claim: object,
    limit: object,
    group: object,
) -> int:
    """Validate a lock's construction arguments (``ValueError`` naming the first bad one,
    a bad ``name`` included: its companion keys must share its hash slot); the lease in
    milliseconds."""
    check_name(name)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be an int >= 1, got {limit!r}")
    if limit > MAX_LIMIT:
        raise ValueError(f"limit must be at most {MAX_LIMIT} (slots), got {limit!r}")
    if limit > 1 and not scripting:
        raise ValueError("limit > 1 needs scripting=True (slots are taken by a script)")
    if group is not None and (not isinstance(group, str) or not group or ":" in group):
        raise ValueError(f"group must be a non-empty string without ':', got {group!r}")
    lease = lease_ms(timeout, "timeout")
    lease_ms(fallback_poll, "fallback_poll")
    check_token("token", token)
    check_token("claim", claim)
    return lease


def check_name(name: object) -> str:
    """Validate a lock name (``ValueError``): a non-empty string whose companion keys can
    share its hash slot; the prefix of those keys (``keyspace.base_key``)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"lock name must be a non-empty string, got {name!r}")
    return companion_key(name, "")  # a name with a '}' but no hash tag: ValueError


def check_token(label: str, given: object) -> None:
    """Validate an owner token argument (``token``, ``claim``): None, or a non-empty string
    without ':' (``ValueError`` naming ``label``)."""
    if given is not None and (not isinstance(given, str) or not given or ":" in given):
        raise ValueError(f"{label} must be a non-empty string without ':', got {given!r}")


def fair_ms(fair_after: object, *, scripting: bool) -> int:
    """Validate ``fair_after`` (None: always first come, first served; else seconds > 0)
    and return it in milliseconds (0 for None). The plain protocol hands nothing over,
    so it has no order to relax: ``fair_after`` needs scripting."""
    if fair_after is None:
        return 0
    if not scripting:
        raise ValueError("fair_after needs scripting=True (the hand-off is done by a script)")
    return lease_ms(fair_after, "fair_after")


def wait_for(timeout: object) -> float | None:
    """Validate ``acquire(timeout=...)``: the seconds to wait, None for ever (None or
    ``math.inf``)."""
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or (isinstance(timeout, float) and math.isnan(timeout))
        or timeout < 0
        or (timeout != math.inf and timeout > MAX_DURATION)
    ):
        raise ValueError(
            f"acquire timeout must be a number of seconds >= 0 and {AT_MOST}, None or "
            f"math.inf (wait forever), got {timeout!r}"
        )
    if timeout is None or timeout == math.inf:
        return None
    return float(timeout)


def holder_text(info: str | dict[str, Any] | None, pid: int) -> str:
    """The holder info stored in the value: the given text, the given mapping as JSON, or
    by default ``{"host", "pid"}`` of this process."""
    if info is None:
        info = {"host": socket.gethostname(), "pid": pid}
    return info if isinstance(info, str) else json.dumps(info, sort_keys=True)


# -- the hold a call is about ---------------------------------------------------------------


def hold_for(
    mine: Hold | None,
    holds: Collection[Hold],
    contended: Collection[Hold],
    holder_alive: Callable[[Hold], bool],
) -> Hold | None:
    """The hold a call is about: the caller's own (``mine``); else the only hold of the
    instance, unless the caller contended with that very hold (its acquire failed against
    it) while its holder (a thread, a task) is still alive."""
    if mine is not None or len(holds) != 1:
        return mine
    hold = next(iter(holds))
    if hold in contended and holder_alive(hold):
        # A contender never speaks for a live holder; once the holder is gone, someone must
        # be able to release what it left (else auto_renew would keep it for ever).
        return None
    return hold


# -- waiting --------------------------------------------------------------------------------


def acquire_mode(queued: bool, blocking: bool) -> bytes:
    """ACQUIRE's mode: b"1" a try after waiting, b"0" a first blocking try (which queues the
    caller when the lock is held), b"x" a non-blocking try (which asks nobody to wake it)."""
    return b"1" if queued else b"0" if blocking else b"x"


def poll_cap(fallback_poll: float, socket_timeout: float | None) -> float:
    """The longest single block: the fallback poll, and never near the client's socket
    timeout (a BLPOP must return before the connection gives up on it)."""
    return (
        fallback_poll
        if socket_timeout is None
        else min(fallback_poll, socket_timeout * SOCKET_SHARE)
    )


class Next(Enum):
    """What a waiter does after a try that found the lock held."""

    GIVE_UP = "give up"  # a non-blocking try: report the lock held
    CANCEL = "cancel"  # the wait is over: leave the queue (keeping a grant that came)
    WAIT = "wait"  # block (``Step.pop``) and/or sleep (``Step.sleep``), then try again


class Step(NamedTuple):
    """The next step of an acquire whose try found the lock held: ``pop`` is the BLPOP
    timeout on the grant and signal lists (None: no BLPOP), ``sleep`` the last stretch
    before a lease ends, timed in the client."""

    next: Next
    pop: float | None = None
    sleep: float = 0.0


def next_step(
    left_ms: int,
    *,
    blocking: bool,
    deadline: float | None,
    now: float,
    poll_ms: int,
    cap: float,
) -> Step:
    """After a try that found the lock held for ``left_ms`` more (at monotonic ``now``):
    give up (non-blocking), leave the queue (``deadline`` passed), or wait until a release
    hands the lock over or wakes us, the holder's lease ends (a crash is noticed then), or
    the fallback period passes.

    The server checks BLPOP timeouts only on its timer tick, up to ~0.1 s late: a BLPOP asks
    for ``TIMER_SLACK`` less and wakes early rather than late; a stretch too short for that
    is slept in the client."""
    if not blocking:
        return Step(Next.GIVE_UP)
    if deadline is not None and now >= deadline:
        return Step(Next.CANCEL)
    seconds = min(max(1, left_ms) / 1000 + MIN_WAIT, poll_ms / 1000)
    if deadline is not None:
        seconds = min(seconds, deadline - now)
    seconds = min(seconds, cap)
    if seconds > TIMER_SLACK + BLPOP_MARGIN:
        return Step(Next.WAIT, pop=round(seconds - TIMER_SLACK, 3))
    return Step(Next.WAIT, sleep=max(0.0, seconds))


# -- reading the server's answers -----------------------------------------------------------


def value_of(raw: bytes | str | None) -> LockValue | None:
    """A key's value as read (None: no key), parsed."""
    return parse_value(raw) if raw is not None else None


def reply_lost(error: BaseException) -> bool:
    """Whether ``error`` (a ``LockBackendError``) may hide a write the server made: its
    cause is a connection lost or timed out mid-call, so the reply, not the call, may be
    what went missing."""
    return isinstance(error.__cause__, (redis.ConnectionError, redis.TimeoutError))


def owns(value: LockValue | None, token: str, now_ms: int) -> bool:
    """Whether ``value`` (None: no key) is held under ``token`` at server time ``now_ms``."""
    return value is not None and value.token == token and value.held_at(now_ms)


def holder_at(now_ms: int, value: LockValue | None, ttl_ms: int | None) -> Holder | None:
    """Who holds a key whose value (None: no key) and PTTL were read at server time
    ``now_ms``, or None when nobody does."""
    return value.holder(now_ms, ttl_ms) if value is not None else None


def holders_at(now_ms: int, slots: Iterable[tuple[str, LockValue | None, int]]) -> list[Holder]:
    """The holders of the slots read at server time ``now_ms`` (key, value, PTTL each)."""
    found = []
    for _, value, ttl in slots:
        holder = holder_at(now_ms, value, ttl)
        if holder is not None:
            found.append(holder)
    return found


def slot_held_by(slots: Iterable[tuple[str, LockValue | None, int]], token: str) -> str | None:
    """The key of the first slot read (key, value, PTTL each) whose value has ``token``."""
    return next(
        (key for key, value, _ in slots if value is not None and value.token == token), None
    )


def newest(holders: Iterable[Holder]) -> Holder | None:
    """With several slots held, the newest holder (the largest fencing token), or None."""
    return max(holders, key=lambda holder: holder.fence or 0, default=None)


def slot_key(name: str, number: int) -> str:
    """The key of slot ``number`` of lock ``name``: the lock key, or ``<base>slot:<i>``."""
    return name if number == 1 else companion_key(name, f"{SLOT}{number}")


def slot_number(member: bytes | str) -> int | None:
    """A slot number as the slot index or its owners' hash store it, or None for anything
    else."""
    text = member.decode("ascii", "replace") if isinstance(member, bytes) else member
    if not text.isascii() or not text.isdigit() or text.startswith("0"):
        return None
    number = int(text)
    return number if number <= MAX_LIMIT else None


def slot_numbers(members: Iterable[bytes | str], limit: int) -> list[int]:
    """The slots to look at, in order, from the slot index's members held now: slot 1
    always, and every valid one up to ``limit``."""
    numbers = {1}
    for member in members:
        number = slot_number(member)
        if number is not None and number <= limit:
            numbers.add(number)
    return sorted(numbers)


def ensure_held(hold: Hold | None, name: str) -> None:
    """Raise unless ``hold`` can still be trusted: ``LockNotOwned`` when there is no hold
    here, ``LockLost`` when its lease is gone (a renewal found it taken or expired, or the
    last confirmed lease ran out). Judged by the local clock: no round trip."""
    if hold is None or hold.ended:
        raise LockNotOwned("the lock is not held here", name)
    if hold.lost_by(time.monotonic()):
        raise LockLost("the lease of the lock was lost: another holder may run now", name)
