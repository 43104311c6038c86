"""The lock's own part of an explanation: who holds the key (with ``lock_limit``, the
slots the slot index names, each checked against its value), and who waits for it (the
waiters' queue ``<base>queue`` and each waiter's ``<base>waiter:<token>``).

It is a face like the modes' (:mod:`.face`), the first the explain driver runs; the marks
modes leave in a holder's info are read by their own modules (a success hold:
:func:`.lifetime.held_after_success`; a key handed to a parked call:
:func:`.parking.handed_hold`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from celery_singleton_lock.engine.constants import MAX_LIMIT
from celery_singleton_lock.engine.keyspace import QUEUE, SLOT, SLOTS, WAITER
from celery_singleton_lock.engine.value import LockValue, parse_value
from celery_singleton_lock.modes.face import (
    Asked,
    Face,
    Lines,
    clock,
    fields,
    holder_info,
    listed,
    pid_of,
    seconds,
    since,
    text,
    who,
)
from celery_singleton_lock.modes.lifetime import held_after_success
from celery_singleton_lock.modes.parking import handed_hold

if TYPE_CHECKING:
    from celery_singleton_lock.options import LockOptions

__all__ = ["Held", "HoldersFace", "Waiter"]

#: A lease written less than this after the hold began is its first, not a renewal (ms).
_RENEWAL_SLACK_MS = 50
_WAITER_VALUE = re.compile(r"(\d+)(?:/[^:]*)?:(.*)", re.DOTALL)


@dataclass(frozen=True)
class Held:
    """One hold of the key (with ``lock_limit``, one per slot held).

    ``state``: ``running`` (a run holds it), ``queued`` (taken at publish, its message not
    started), ``handed`` (handed to a parked call that has not started), ``held after
    success`` (``lock_release="success"``: nobody runs it), ``classic`` (a plain timestamp
    another program wrote), ``foreign`` (any other value), or ``expired`` (its lease ended:
    the next call takes it over). ``since`` is the server time the hold began, in Unix
    seconds (its fencing token is the server clock in microseconds then; for a queue-scope
    hold, the publish), ``age`` the seconds since. ``lease`` is the lease this hold is taken
    for, when known (the task's ``lock_timeout``, ``lock_queue_timeout`` or ``lock_hold``,
    checked against the value), and ``renewed`` the seconds since its lease was last
    renewed (None: not renewed yet, or not knowable).
    """

    key: str
    slot: int
    state: str
    task_id: str | None = None
    task: str | None = None
    host: str | None = None
    pid: int | None = None
    since: float | None = None
    age: float | None = None
    lease_left: float | None = None
    lease: float | None = None
    renewed: float | None = None
    fence: int | None = None

    @property
    def live(self) -> bool:
        return self.state != "expired"

    def describe(self) -> str:
        if self.state == "classic":
            holder = "a classic SETNX locker (a plain timestamp)"
        elif self.state == "foreign":
            holder = "a value another program wrote"
        else:
            holder = who(self.task, self.task_id, self.host, self.pid)
        parts = [f"{holder}: {self.state}"]
        if self.state == "expired":
            if self.age is not None:
                parts[0] += f" (taken {seconds(self.age)} ago, at {clock(self.since)})"
            parts.append("its lease ended: the next call takes the key over")
        elif self.age is not None:
            parts[0] += f" for {seconds(self.age)} (since {clock(self.since)})"
        if self.lease_left is not None:
            parts.append(f"lease left {seconds(self.lease_left)}")
        if self.state == "running" and self.lease is not None:
            parts.append(
                f"renewed {seconds(self.renewed)} ago"
                if self.renewed is not None
                else "not renewed yet"
            )
        if self.fence is not None:
            parts.append(f"fence {self.fence}")
        return ", ".join(parts)


@dataclass(frozen=True)
class Waiter:
    """A run blocked on the key (``lock_on_conflict="wait"``), ``position`` 1 being next;
    ``since``: when it queued (server time, Unix seconds), ``waited``: seconds since."""

    position: int
    task_id: str | None = None
    task: str | None = None
    host: str | None = None
    pid: int | None = None
    since: float | None = None
    waited: float | None = None

    def describe(self) -> str:
        text = f"{self.position}. {who(self.task, self.task_id, self.host, self.pid)}"
        return text + (f", waiting {seconds(self.waited)}" if self.waited is not None else "")


def _limit(asked: Asked) -> int:
    return asked.options.limit if asked.options is not None else 1


def _slot_numbers(found: list[Any], limit: int) -> list[int]:
    """The slots >= 2 the slot index names (slot 1, the lock key, is always read)."""
    numbers = set()
    for member in found:
        name = text(member) or ""
        if name.isascii() and name.isdigit() and not name.startswith("0"):
            numbers.add(int(name))
    return sorted(number for number in numbers if 1 < number <= min(limit, MAX_LIMIT))


class HoldersFace(Face):
    """``holders``, ``slots``, ``slots_held``, ``waiters``, ``waiting``; state ``held``
    or ``held after success``. The first round trip reads the lock value and its PTTL,
    the waiters' queue and its size, and the slots the index names as held (or lapsed);
    the second each listed waiter's place, each named slot's value and PTTL, and (when the
    index names more than are listed) how many it counts held."""

    suffixes = (QUEUE, WAITER, SLOT, SLOTS)
    states = ("held", "held after success")
    fields = ("holders", "slots", "slots_held", "waiters", "waiting")

    def first(self, asked: Asked, pipe: Any) -> None:
        pipe.get(asked.key)
        pipe.pttl(asked.key)
        pipe.zrange(asked.companion(QUEUE), 0, asked.most - 1, withscores=True)
        pipe.zcard(asked.companion(QUEUE))
        if _limit(asked) > 1:
            # Held or lapsed slots score their lease end (> MAX_LIMIT); a free one its number.
            pipe.zrangebyscore(
                asked.companion(SLOTS), f"({MAX_LIMIT}", "+inf", start=0, num=asked.most
            )

    def second(self, asked: Asked, first: list[Any], pipe: Any) -> None:
        for token, _ in first[2]:
            pipe.get(asked.companion(WAITER + (text(token) or "")))
        limit = _limit(asked)
        if limit > 1:
            for number in _slot_numbers(first[4], limit):
                pipe.get(asked.companion(f"{SLOT}{number}"))
                pipe.pttl(asked.companion(f"{SLOT}{number}"))
            pipe.zcount(asked.companion(SLOTS), f"({asked.now_ms}", "+inf")

    def parts(self, asked: Asked, first: list[Any], second: list[Any]) -> dict[str, Any]:
        limit = _limit(asked)
        raw, ttl, queue, queued = first[:4]
        listed_slots = first[4] if limit > 1 else []
        values = second[: len(queue)]
        numbers = _slot_numbers(listed_slots, limit)
        slot_replies = second[len(queue) : len(queue) + 2 * len(numbers)]
        found = [
            _held(asked, asked.key, 1, raw, ttl),
            *(
                _held(asked, asked.companion(f"{SLOT}{number}"), number, value, slot_ttl)
                for number, value, slot_ttl in zip(
                    numbers, slot_replies[0::2], slot_replies[1::2], strict=True
                )
            ),
        ]
        holders = tuple(held for held in found if held is not None)
        slots_held = sum(held.live for held in holders)
        if limit > 1 and len(listed_slots) >= asked.most:  # more held than listed: the index counts
            slots_held = max(slots_held, int(second[-1]))
        waiters = _waiters(queue, values, asked.now_us)
        return {
            "holders": holders,
            "slots": limit,
            "slots_held": slots_held,
            "waiters": tuple(waiters),
            "waiting": max(0, int(queued) - (len(queue) - len(waiters))),
        }

    def state_of(self, explanation: Any) -> tuple[str, ...]:
        live = [held for held in explanation.holders if held.live]
        if not live:
            return ()
        success = all(held.state == "held after success" for held in live)
        return ("held after success" if success else "held",)

    def lines(self, explanation: Any) -> Lines:
        slots = explanation.slots
        lines: Lines = []
        if slots > 1:
            lines.append(("Slots", f"{explanation.slots_held} of {slots} held"))
        for held in explanation.holders:
            slot = f"slot {held.slot}: " if slots > 1 else ""
            lines.append(("Holder", slot + held.describe()))
        if not explanation.holders:
            lines.append(("Holder", "nobody"))
        listed(lines, "Waiters", explanation.waiting, explanation.waiters, "waiting")
        return lines

    def as_json(self, explanation: Any) -> dict[str, Any]:
        return {
            "slots": {"limit": explanation.slots, "held": explanation.slots_held},
            "holders": [fields(held) for held in explanation.holders],
            "waiters": [fields(waiter) for waiter in explanation.waiters],
            "waiting": explanation.waiting,
        }

    def from_json(self, data: Mapping[str, Any]) -> dict[str, Any]:
        slots = data.get("slots") or {}
        return {
            "holders": tuple(Held(**held) for held in data.get("holders") or ()),
            "slots": int(slots.get("limit", 1)),
            "slots_held": int(slots.get("held", 0)),
            "waiters": tuple(Waiter(**waiter) for waiter in data.get("waiters") or ()),
            "waiting": int(data.get("waiting", 0)),
        }


def _waiters(queue: list[Any], values: list[Any], now_us: int) -> list[Waiter]:
    """The live waiters in queue order (a waiter whose place lapsed is passed over, as the
    release passes it over)."""
    waiters: list[Waiter] = []
    for (_, score), value in zip(queue, values, strict=True):
        value_text = text(value)
        found = _WAITER_VALUE.fullmatch(value_text) if value_text is not None else None
        if found is None:
            continue
        info = holder_info(found.group(2))
        at, waited = since(float(score), now_us)
        waiters.append(
            Waiter(
                position=len(waiters) + 1,
                task_id=text(info.get("task_id")),
                task=text(info.get("task")),
                host=text(info.get("host")),
                pid=pid_of(info),
                since=at,
                waited=waited,
            )
        )
    return waiters


def _hold_state(value: LockValue, info: Mapping[str, Any], held: bool) -> str:
    if not held:
        return "expired"
    if value.expiry_ms is None:
        return "foreign"
    if value.classic:
        return "classic"
    if held_after_success(info):
        return "held after success"
    if handed_hold(info):
        return "handed"
    return "queued" if info.get("queued") is True else "running"


def _lease_seconds(
    state: str, info: Mapping[str, Any], task: str | None, options: LockOptions | None
) -> float:
    """The lease a hold of ``state`` is taken for, by the task's options (0: unknown)."""
    if options is None or (task is not None and info.get("task") not in (None, task)):
        return 0.0
    if state == "running":
        return float(options.timeout)
    if state in ("queued", "handed"):
        return float(options.queue_timeout)
    if state == "held after success" and options.hold is not None:
        return float(options.hold)
    return 0.0


def _renewal(
    value: LockValue, lease: float, began_at: float | None, now_ms: int
) -> tuple[float | None, float | None]:
    """(the lease, seconds since it was last renewed) of a hold taken for ``lease`` seconds
    by its task's options (0: unknown): its value's expiry minus the lease is when the
    lease was last written. A lease written as the hold began was not renewed (None); an
    expiry that the lease cannot explain (a per-call ``lock_timeout``) leaves both
    unknown."""
    if not lease or value.expiry_ms is None or began_at is None:
        return None, None
    written = value.expiry_ms - round(lease * 1000)
    began = round(began_at * 1000)
    if written > now_ms + _RENEWAL_SLACK_MS or written < began - _RENEWAL_SLACK_MS:
        return None, None
    if written <= began + _RENEWAL_SLACK_MS:
        return lease, None
    return lease, round(max(0, now_ms - written) / 1000, 3)


def _held(asked: Asked, key: str, slot: int, raw: Any, ttl: Any) -> Held | None:
    """The hold of one lock or slot key, None when there is no value there."""
    if raw is None or isinstance(raw, Exception):
        return None
    now_ms, now_us = asked.now_ms, asked.now_us
    value = parse_value(raw)
    ttl_ms = ttl if isinstance(ttl, int) and ttl >= 0 else None
    holder = value.holder(now_ms, ttl_ms)
    info = holder.info if holder is not None else holder_info(value.info)
    state = _hold_state(value, info, holder is not None)
    began, age = since(value.fence, now_us) if not value.classic else (None, None)
    left = holder.remaining_ms if holder is not None else None
    taken_for = _lease_seconds(state, info, asked.task, asked.options)
    lease, renewed = _renewal(value, taken_for, began, now_ms)
    return Held(
        key=key,
        slot=slot,
        state=state,
        task_id=text(info.get("task_id")),
        task=text(info.get("task")),
        host=text(info.get("host")),
        pid=pid_of(info),
        since=began,
        age=age,
        lease_left=round(left / 1000, 3) if left is not None else None,
        lease=lease,
        renewed=renewed,
        fence=value.fence if not value.classic and value.expiry_ms is not None else None,
    )
