"""Why a key blocks: who holds it, who waits for it, what is parked, pending, throttled or
debouncing there, read from the lock Redis on its own clock.

:func:`explain_key` reads one lock key and every companion a mode keeps beside it
(:mod:`.engine.keyspace`): the lock value (or, with ``lock_limit``, the slots the slot
index names, each checked against its value), the waiters' queue ``<base>queue`` and each
waiter's ``<base>waiter:<token>``, the park queue ``<base>parked`` with ``<base>parkdata``
and the calls handed the key ``<base>granted``, the pending follow-up ``<base>pending``, the
recent starts ``<base>starts`` (against the task's ``lock_rate_limit``), and the open burst
``<base>debounce`` with ``<base>burst:<id>`` and the done set. All the keys share the lock's
hash slot. It costs two round trips at most (one when the key has nothing but a holder; a
Redis Cluster adds one, for its node's ``TIME``), never a SCAN, and lists at most ``most``
waiters, parked calls and slot holders (the totals are exact).

It sits below the modes, so that a conflict policy can attach an explanation to a
``TaskLocked`` or to a skip record (:func:`conflict_explanation`, which never raises); the
``celery locks explain`` command and ``task.lock_explain()`` build on it.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

from redis.cluster import RedisCluster

from celery_singleton_lock.engine.constants import MAX_LIMIT, STACK_AHEAD
from celery_singleton_lock.engine.keyspace import (
    BURST,
    DEBOUNCE,
    DONE,
    GRANTED,
    PARKDATA,
    PARKED,
    PENDING,
    QUEUE,
    SLOT,
    SLOTS,
    STARTS,
    WAITER,
    companion_key,
)
from celery_singleton_lock.engine.stack import Stack
from celery_singleton_lock.engine.value import LockValue, parse_value
from celery_singleton_lock.engine.wire import LockClient, call, server_time, time_reply
from celery_singleton_lock.exceptions import LockError
from celery_singleton_lock.options import parse_rate

if TYPE_CHECKING:
    from celery_singleton_lock.options import LockOptions

__all__ = [
    "CONFLICT_MOST",
    "MOST",
    "STATES",
    "Burst",
    "Explanation",
    "FollowUp",
    "Handed",
    "Held",
    "LimitUse",
    "Parked",
    "Throttle",
    "Waiter",
    "conflict_explanation",
    "explain_key",
    "weighed_stack",
]

log = logging.getLogger("celery_singleton_lock.task")

#: How many waiters, parked calls, handed calls and slot holders an explanation lists.
MOST = 50
#: The same, for the explanation a conflict attaches to a ``TaskLocked`` or a skip record.
CONFLICT_MOST = 10
#: The states of a key, as :attr:`Explanation.state` names them.
STATES = ("free", "held", "held after success", "parked", "throttled", "debouncing", "limited")
#: A lease written less than this after the hold began is its first, not a renewal (ms).
_RENEWAL_SLACK_MS = 50
_WAITER_VALUE = re.compile(r"(\d+)(?:/[^:]*)?:(.*)", re.DOTALL)


# ------------------------------------------------------------------------------ parts


def _who(task: str | None, task_id: str | None, host: str | None, pid: int | None) -> str:
    """``shop.buy[<id>] on host/pid``, as far as it is known."""
    name = f"{task or 'task'}[{task_id}]" if task_id else (task or "not a task")
    where = "/".join(str(part) for part in (host, pid) if part is not None)
    return f"{name} on {where}" if where else name


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def _clock(unix: float | None) -> str:
    """A server time as the text shows it: ``10:41:07 UTC``."""
    if unix is None:
        return "-"
    moment = datetime.datetime.fromtimestamp(unix, tz=datetime.timezone.utc)
    return moment.strftime("%H:%M:%S UTC")


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
            who = "a classic SETNX locker (a plain timestamp)"
        elif self.state == "foreign":
            who = "a value another program wrote"
        else:
            who = _who(self.task, self.task_id, self.host, self.pid)
        parts = [f"{who}: {self.state}"]
        if self.state == "expired":
            if self.age is not None:
                parts[0] += f" (taken {_seconds(self.age)} ago, at {_clock(self.since)})"
            parts.append("its lease ended: the next call takes the key over")
        elif self.age is not None:
            parts[0] += f" for {_seconds(self.age)} (since {_clock(self.since)})"
        if self.lease_left is not None:
            parts.append(f"lease left {_seconds(self.lease_left)}")
        if self.state == "running" and self.lease is not None:
            parts.append(
                f"renewed {_seconds(self.renewed)} ago"
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
        text = f"{self.position}. {_who(self.task, self.task_id, self.host, self.pid)}"
        return text + (f", waiting {_seconds(self.waited)}" if self.waited is not None else "")


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
        text = f"{self.position}. {_who(self.task, self.task_id, None, None)}"
        return text + (f", parked {_seconds(self.waited)}" if self.waited is not None else "")


@dataclass(frozen=True)
class Handed:
    """A parked call that was handed the key ``age`` seconds ago and has not started."""

    task_id: str
    since: float | None = None
    age: float | None = None

    def describe(self) -> str:
        return f"[{self.task_id}] handed the key {_seconds(self.age)} ago, not started yet"


@dataclass(frozen=True)
class FollowUp:
    """The key's pending follow-up (``coalesce``, ``replace``): the call that runs when the
    holder ends, under ``task_id``; ``host`` and ``pid``: the process that made the first
    call it stands for."""

    task_id: str
    task: str | None = None
    host: str | None = None
    pid: int | None = None

    def describe(self) -> str:
        where = "/".join(str(part) for part in (self.host, self.pid) if part is not None)
        called = f", called on {where}" if where else ""
        return f"{_who(self.task, self.task_id, None, None)}{called}: runs when the holder ends"


@dataclass(frozen=True)
class Throttle:
    """The key's start rate (``lock_rate_limit``): ``count`` of ``limit`` starts in the last
    ``window`` seconds; the next start is free at ``next_start`` (server time, Unix
    seconds), ``next_start_in`` seconds from now (0: now)."""

    rate: str
    limit: int
    window: float
    count: int
    next_start: float
    next_start_in: float

    @property
    def throttled(self) -> bool:
        return self.next_start_in > 0

    def describe(self) -> str:
        text = f"{self.count} of {self.limit} starts ({self.rate}) in the last {self.window:g}s"
        if self.throttled:
            return text + f"; next free start in {_seconds(self.next_start_in)}"
        return text + "; a start is free now"


@dataclass(frozen=True)
class LimitUse:
    """One stacked limit of the call (``lock_limits``): its rendered ``name``, the
    ``number`` that applies now (``source`` says where it came from: ``"name"`` or
    ``"template"`` when set in Redis, ``"code"``), the weight ``used`` by ``holds`` live
    shares, the weight ``waiting`` of the runs in its line (room a new run leaves them),
    the call's own ``weight``, and whether it ``fits`` now (both None when the task's
    ``lock_weight`` failed for this call: :attr:`Explanation.weight_error`)."""

    name: str
    template: str
    number: int
    source: str
    used: int
    holds: int
    weight: int | None
    waiting: int = 0

    @property
    def fits(self) -> bool | None:
        if self.weight is None:
            return None
        return self.used + self.waiting + self.weight <= self.number

    def describe(self) -> str:
        text = (
            f"{self.name}: {self.used} of {self.number} used by {self.holds} "
            f"hold{'s' if self.holds != 1 else ''} (number from {self.source})"
        )
        if self.waiting:
            text += f", {self.waiting} waiting in line"
        if self.weight is None:
            return text + "; this call's weight is unknown (lock_weight failed)"
        verdict = "fits" if self.fits else "does not fit"
        return text + f"; this call's weight {self.weight} {verdict}"


@dataclass(frozen=True)
class Burst:
    """The key's debounce burst: its task id, how many ``calls`` it gathered, its first
    call and the time its run is due (server time, Unix seconds; ``due_in`` seconds from
    now, negative once due), and whether it is ``open`` (still gathering calls), ``due``
    (waiting for its run) or ``finished``."""

    task_id: str
    calls: int
    first_call: float | None
    due: float
    due_in: float
    state: str

    @property
    def pending(self) -> bool:
        return self.state != "finished"

    def describe(self) -> str:
        text = f"[{self.task_id}] {self.calls} call{'s' if self.calls != 1 else ''}, "
        if self.state == "open":
            return text + f"runs in {_seconds(self.due_in)} (at {_clock(self.due)})"
        if self.state == "due":
            return text + f"due {_seconds(-self.due_in)} ago, waiting for its run"
        return text + "finished"


@dataclass(frozen=True)
class Explanation:
    """Why a key blocks a call, as the lock Redis had it at server time ``now`` (Unix
    seconds).

    ``state`` is the first of ``states`` (``"free"`` when none applies): ``"held"`` or
    ``"held after success"``, ``"parked"``, ``"throttled"``, ``"debouncing"``, ``"limited"``
    (a stacked limit of the call has no room for its weight: ``limits``). ``holders``
    are the holds (one per slot held; an expired one, whose key the next call takes over,
    is listed too), ``slots`` the key's ``lock_limit`` and ``slots_held`` how many are
    held. ``waiters``, ``parked`` and ``handed`` list at most a bound of each, in turn
    order; ``waiting`` and ``parked_total`` are the totals. ``as_json()`` is a plain dict
    (what ``TaskLocked.explanation`` and a skip record carry), :meth:`from_json` reads one
    back, ``str()`` is the text ``celery locks explain`` prints. ``weight_error``: why the
    task's ``lock_weight`` gave no weight for this call (the limits are listed without
    one, and nothing says whether the call fits); None, and left out of the JSON, when
    it gave one.
    """

    key: str
    now: float
    task: str | None = None
    holders: tuple[Held, ...] = ()
    slots: int = 1
    slots_held: int = 0
    waiters: tuple[Waiter, ...] = ()
    waiting: int = 0
    parked: tuple[Parked, ...] = ()
    parked_total: int = 0
    handed: tuple[Handed, ...] = ()
    follow_up: FollowUp | None = None
    throttle: Throttle | None = None
    debounce: Burst | None = None
    limits: tuple[LimitUse, ...] = ()
    states: tuple[str, ...] = field(default=())
    weight_error: str | None = None

    @property
    def state(self) -> str:
        return self.states[0] if self.states else "free"

    @property
    def holder(self) -> Held | None:
        """The live holder (with slots, the newest one), or None."""
        live = [held for held in self.holders if held.live]
        return max(live, key=lambda held: held.fence or 0) if live else None

    def as_json(self) -> dict[str, Any]:
        """The explanation as JSON values (``celery locks explain --json``)."""
        found: dict[str, Any] = {
            "key": self.key,
            "task": self.task,
            "state": self.state,
            "states": list(self.states),
            "now": self.now,
            "slots": {"limit": self.slots, "held": self.slots_held},
            "holders": [_fields(held) for held in self.holders],
            "waiters": [_fields(waiter) for waiter in self.waiters],
            "waiting": self.waiting,
            "parked": [_fields(parked) for parked in self.parked],
            "parked_total": self.parked_total,
            "handed": [_fields(handed) for handed in self.handed],
            "follow_up": _fields(self.follow_up) if self.follow_up else None,
            "throttle": _fields(self.throttle) if self.throttle else None,
            "debounce": _fields(self.debounce) if self.debounce else None,
            "limits": [{**_fields(use), "fits": use.fits} for use in self.limits],
        }
        if self.weight_error is not None:
            found["weight_error"] = self.weight_error
        return found

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Explanation:
        """An explanation from :meth:`as_json`'s dict (as ``TaskLocked.explanation`` and
        ``skip_info(result).explanation`` carry it)."""
        slots = data.get("slots") or {}
        return cls(
            key=str(data["key"]),
            now=float(data["now"]),
            task=data.get("task"),
            holders=tuple(Held(**held) for held in data.get("holders") or ()),
            slots=int(slots.get("limit", 1)),
            slots_held=int(slots.get("held", 0)),
            waiters=tuple(Waiter(**waiter) for waiter in data.get("waiters") or ()),
            waiting=int(data.get("waiting", 0)),
            parked=tuple(Parked(**parked) for parked in data.get("parked") or ()),
            parked_total=int(data.get("parked_total", 0)),
            handed=tuple(Handed(**handed) for handed in data.get("handed") or ()),
            follow_up=FollowUp(**data["follow_up"]) if data.get("follow_up") else None,
            throttle=Throttle(**data["throttle"]) if data.get("throttle") else None,
            debounce=Burst(**data["debounce"]) if data.get("debounce") else None,
            limits=tuple(
                LimitUse(**{name: value for name, value in use.items() if name != "fits"})
                for use in data.get("limits") or ()
            ),
            states=tuple(data.get("states") or ()),
            weight_error=data.get("weight_error"),
        )

    def __str__(self) -> str:
        lines = [("Key", self.key), ("State", self.state)]
        if self.slots > 1:
            lines.append(("Slots", f"{self.slots_held} of {self.slots} held"))
        for held in self.holders:
            slot = f"slot {held.slot}: " if self.slots > 1 else ""
            lines.append(("Holder", slot + held.describe()))
        if not self.holders:
            lines.append(("Holder", "nobody"))
        _listed(lines, "Waiters", self.waiting, self.waiters, "waiting")
        _listed(lines, "Parked", self.parked_total, self.parked, "parked")
        lines.extend(("Handed", handed.describe()) for handed in self.handed)
        if self.follow_up is not None:
            lines.append(("Follow-up", self.follow_up.describe()))
        if self.throttle is not None:
            lines.append(("Throttle", self.throttle.describe()))
        if self.debounce is not None:
            lines.append(("Debounce", self.debounce.describe()))
        lines.extend(("Limit", use.describe()) for use in self.limits)
        if self.weight_error is not None:
            lines.append(("Weight", f"unknown: {self.weight_error}"))
        width = max(len(label) for label, _ in lines) + 2
        return "\n".join(f"{label:<{width}}{text}".rstrip() for label, text in lines)


def _listed(
    lines: list[tuple[str, str]],
    label: str,
    total: int,
    items: Sequence[Waiter | Parked],
    what: str,
) -> None:
    """``Waiters  3, in turn order`` and one line per item listed (and how many are not)."""
    if not total and not items:
        return
    lines.append((label, f"{total} {what}, in turn order"))
    lines.extend(("", item.describe()) for item in items)
    if total > len(items):
        lines.append(("", f"... and {total - len(items)} more"))


def _fields(part: Any) -> dict[str, Any]:
    return {name: getattr(part, name) for name in part.__dataclass_fields__}


# ---------------------------------------------------------------------------- reading


def _text(value: object) -> str | None:
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _info(text: str | None) -> dict[str, Any]:
    """Holder info as stored (JSON), ``{}`` when it is not a JSON object."""
    if not text:
        return {}
    try:
        info = json.loads(text)
    except ValueError:
        return {}
    return info if isinstance(info, dict) else {}


def _pid(info: Mapping[str, Any]) -> int | None:
    pid = info.get("pid")
    return pid if isinstance(pid, int) and not isinstance(pid, bool) else None


def _since(micros: float | None, now_us: int) -> tuple[float | None, float | None]:
    """(Unix seconds, seconds ago) of a server time in microseconds, when plausible."""
    if micros is None or not 0 < micros <= now_us:
        return None, None
    return round(micros / 1_000_000, 6), round((now_us - micros) / 1_000_000, 3)


def _hold_state(value: LockValue, info: Mapping[str, Any], held: bool) -> str:
    if not held:
        return "expired"
    if value.expiry_ms is None:
        return "foreign"
    if value.classic:
        return "classic"
    if info.get("held") == "success":
        return "held after success"
    if info.get("parked") is True:
        return "handed"
    return "queued" if info.get("queued") is True else "running"


def _lease_seconds(state: str, info: Mapping[str, Any], task: str | None, options: Any) -> float:
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
    value: LockValue, lease: float, since: float | None, now_ms: int
) -> tuple[float | None, float | None]:
    """(the lease, seconds since it was last renewed) of a hold taken for ``lease`` seconds
    by its task's options (0: unknown): its value's expiry minus the lease is when the
    lease was last written. A lease written as the hold began was not renewed (None); an
    expiry that the lease cannot explain (a per-call ``lock_timeout``) leaves both
    unknown."""
    if not lease or value.expiry_ms is None or since is None:
        return None, None
    written = value.expiry_ms - round(lease * 1000)
    began = round(since * 1000)
    if written > now_ms + _RENEWAL_SLACK_MS or written < began - _RENEWAL_SLACK_MS:
        return None, None
    if written <= began + _RENEWAL_SLACK_MS:
        return lease, None
    return lease, round(max(0, now_ms - written) / 1000, 3)


def _held(
    key: str,
    slot: int,
    raw: Any,
    ttl: Any,
    *,
    now: tuple[int, int],
    task: str | None,
    options: LockOptions | None,
) -> Held | None:
    """The hold of one lock or slot key, None when there is no value there."""
    if raw is None or isinstance(raw, Exception):
        return None
    now_ms, now_us = now
    value = parse_value(raw)
    ttl_ms = ttl if isinstance(ttl, int) and ttl >= 0 else None
    holder = value.holder(now_ms, ttl_ms)
    info = holder.info if holder is not None else _info(value.info)
    state = _hold_state(value, info, holder is not None)
    since, age = _since(value.fence, now_us) if not value.classic else (None, None)
    left = holder.remaining_ms if holder is not None else None
    lease, renewed = _renewal(value, _lease_seconds(state, info, task, options), since, now_ms)
    return Held(
        key=key,
        slot=slot,
        state=state,
        task_id=_text(info.get("task_id")),
        task=_text(info.get("task")),
        host=_text(info.get("host")),
        pid=_pid(info),
        since=since,
        age=age,
        lease_left=round(left / 1000, 3) if left is not None else None,
        lease=lease,
        renewed=renewed,
        fence=value.fence if not value.classic and value.expiry_ms is not None else None,
    )


def _slot_number(member: Any) -> int | None:
    text = _text(member) or ""
    if not text.isascii() or not text.isdigit() or text.startswith("0"):
        return None
    number = int(text)
    return number if number <= MAX_LIMIT else None


def _pipeline(client: LockClient) -> Any:
    return cast("Any", client).pipeline(transaction=False)  # untyped on a cluster


@dataclass(frozen=True)
class _First:
    """What the first round trip read: the lock value and its PTTL, the waiters' queue and
    its size, the park queue and its size, the handed calls, the pending follow-up, the
    open burst and the slots the slot index names as held (or lapsed)."""

    raw: Any
    ttl: Any
    queue: list[Any]
    queued: int
    parked: list[Any]
    parked_total: int
    granted: list[Any]
    pending: list[Any]
    burst: list[Any]
    slots: list[Any]

    @property
    def tokens(self) -> list[str]:
        return [_text(token) or "" for token, _ in self.queue]

    @property
    def parked_ids(self) -> list[str]:
        return [_text(task_id) or "" for task_id, _ in self.parked]

    @property
    def burst_id(self) -> str | None:
        return _text(self.burst[0])

    def slot_numbers(self, limit: int) -> list[int]:
        """The slots >= 2 the index names (slot 1, the lock key, is always read)."""
        found = {_slot_number(member) for member in self.slots}
        return sorted(number for number in found if number is not None and 1 < number <= limit)


def _read_first(
    client: LockClient, key: str, names: Mapping[str, str], limit: int, most: int
) -> tuple[tuple[int, int], _First]:
    """The server's clock (ms, µs) and the first round trip (a Redis Cluster reads the
    clock of the key's node first: its pipelines take no keyless command)."""
    cluster = isinstance(client, RedisCluster)
    pipe = _pipeline(client)
    if not cluster:
        pipe.time()
    pipe.get(key)
    pipe.pttl(key)
    pipe.zrange(names[QUEUE], 0, most - 1, withscores=True)
    pipe.zcard(names[QUEUE])
    pipe.zrange(names[PARKED], 0, most - 1, withscores=True)
    pipe.zcard(names[PARKED])
    pipe.zrange(names[GRANTED], 0, most - 1, withscores=True)
    pipe.hmget(names[PENDING], ["id", "info"])
    pipe.hmget(names[DEBOUNCE], ["id", "gen", "first", "due"])
    if limit > 1:
        # Held or lapsed slots score their lease end (> MAX_LIMIT); a free one its number.
        pipe.zrangebyscore(names[SLOTS], f"({MAX_LIMIT}", "+inf", start=0, num=most)
    now = server_time(client, key) if cluster else (0, 0)
    replies = list(call(key, pipe.execute))
    if not cluster:
        now = time_reply(replies.pop(0))
    if limit <= 1:
        replies.append([])
    raw, ttl, queue, queued, parked, parked_total, granted, pending, burst, slots = replies
    first = _First(
        raw, ttl, queue, int(queued), parked, int(parked_total), granted, pending, burst, slots
    )
    return now, first


def _read_second(
    client: LockClient,
    key: str,
    names: Mapping[str, str],
    first: _First,
    *,
    now_ms: int,
    limit: int,
    rate: str | None,
    stack: Stack | None = None,
) -> dict[str, list[Any]]:
    """What depends on the first round trip (or on the clock), in one more: each listed
    waiter's place, the parked calls' records, the slots held, the burst's latest call and
    whether it finished, the starts in the rate's window. Replies by what they are."""
    pipe = _pipeline(client)
    reads: list[str] = []
    if stack is not None:
        for limit_of in stack.limits:
            pipe.zrangebyscore(stack.limit_key(limit_of.name), f"({now_ms}", "+inf")
            pipe.hmget(stack.capacities, [limit_of.name, limit_of.template])
            line = stack.line_key(limit_of.name)
            pipe.zrange(line, 0, STACK_AHEAD - 1)
            pipe.hgetall(line + ":alive")
            reads += ["limit_shares", "limit_set", "limit_line", "limit_alive"]
    for token in first.tokens:
        pipe.get(companion_key(key, WAITER + token))
        reads.append("waiter")
    if first.parked_ids:
        pipe.hmget(names[PARKDATA], first.parked_ids)
        reads.append("parkdata")
    for number in first.slot_numbers(limit):
        pipe.get(companion_key(key, f"{SLOT}{number}"))
        pipe.pttl(companion_key(key, f"{SLOT}{number}"))
        reads += ["slot", "slot_ttl"]
    if limit > 1:
        pipe.zcount(names[SLOTS], f"({now_ms}", "+inf")
        reads.append("slots_held")
    burst_id = first.burst_id
    if burst_id:
        pipe.get(companion_key(key, BURST + burst_id))
        pipe.zscore(names[DONE], burst_id)
        reads += ["burst", "done"]
    if rate is not None:
        rate_limit, window_ms = parse_rate(rate)
        pipe.zcount(names[STARTS], f"({now_ms - window_ms}", "+inf")
        pipe.zrevrange(names[STARTS], rate_limit - 1, rate_limit - 1, withscores=True)
        reads += ["starts", "gate"]
    got: dict[str, list[Any]] = {}
    if reads:
        for name, answer in zip(reads, call(key, pipe.execute), strict=True):
            got.setdefault(name, []).append(answer)
    return got


def explain_key(
    client: LockClient,
    key: str,
    options: LockOptions | None = None,
    *,
    task: str | None = None,
    most: int = MOST,
    stack: Stack | None = None,
    weight_error: str | None = None,
) -> Explanation:
    """Read why lock ``key`` blocks (see :class:`Explanation`), on the server's clock.

    ``options`` are the effective lock options of the key's task (its ``lock_limit``,
    ``lock_rate_limit``, leases): without them the key is read as a single lock with no
    rate. ``task`` is the task's name. At most ``most`` waiters, parked calls, handed calls
    and slot holders are listed. Two round trips at most (one when the key has nothing
    but a holder; a Redis Cluster adds one for ``TIME``); a Redis error raises
    ``LockBackendError``. ``stack``: the call's stacked limits (``lock_limits``), each
    read in the second round trip (its keys share the key's hash slot) and listed;
    ``weight_error``: the call's ``lock_weight`` failed (see :func:`weighed_stack`), so
    ``stack``'s weight is a stand-in and the limits are listed without a weight.
    """
    limit = options.limit if options is not None else 1
    rate = options.rate_limit if options is not None else None
    names = {
        suffix: companion_key(key, suffix)
        for suffix in (QUEUE, PARKED, PARKDATA, GRANTED, PENDING, DEBOUNCE, SLOTS, STARTS, DONE)
    }
    now, first = _read_first(client, key, names, limit, most)
    now_ms, now_us = now
    got = _read_second(
        client, key, names, first, now_ms=now_ms, limit=limit, rate=rate, stack=stack
    )
    numbers = first.slot_numbers(limit)
    slot_keys = [companion_key(key, f"{SLOT}{number}") for number in numbers]
    found = [
        _held(key, 1, first.raw, first.ttl, now=now, task=task, options=options),
        *(
            _held(slot_key, number, raw, ttl, now=now, task=task, options=options)
            for slot_key, number, raw, ttl in zip(
                slot_keys, numbers, got.get("slot", []), got.get("slot_ttl", []), strict=True
            )
        ),
    ]
    holders = tuple(held for held in found if held is not None)
    slots_held = sum(held.live for held in holders)
    if limit > 1 and len(first.slots) >= most:  # more held than listed: the index counts
        slots_held = max(slots_held, int(got["slots_held"][0]))
    tokens = first.tokens
    waiters = _waiters(first.queue, got.get("waiter", []), now_us)
    parkdata = got.get("parkdata", [[]])[0]
    return _explanation(
        key,
        now,
        task=task,
        holders=holders,
        slots=limit,
        slots_held=slots_held,
        waiters=tuple(waiters),
        waiting=max(0, first.queued - (len(tokens) - len(waiters))),
        parked=_parked(first.parked_ids, first.parked, parkdata, now_us),
        parked_total=first.parked_total,
        handed=tuple(
            Handed(_text(task_id) or "", *_since(float(score) * 1000, now_us))
            for task_id, score in first.granted
        ),
        follow_up=_follow_up(first.pending),
        throttle=_throttle(rate, got, now_ms) if rate is not None else None,
        debounce=_burst(first.burst, got, now_ms) if first.burst_id else None,
        limits=_limits(stack, got, now_ms, weighed=weight_error is None)
        if stack is not None
        else (),
        weight_error=weight_error,
    )


def _waiters(queue: list[Any], values: list[Any], now_us: int) -> list[Waiter]:
    """The live waiters in queue order (a waiter whose place lapsed is passed over, as the
    release passes it over)."""
    waiters: list[Waiter] = []
    for (_, score), value in zip(queue, values, strict=True):
        text = _text(value)
        found = _WAITER_VALUE.fullmatch(text) if text is not None else None
        if found is None:
            continue
        info = _info(found.group(2))
        since, waited = _since(float(score), now_us)
        waiters.append(
            Waiter(
                position=len(waiters) + 1,
                task_id=_text(info.get("task_id")),
                task=_text(info.get("task")),
                host=_text(info.get("host")),
                pid=_pid(info),
                since=since,
                waited=waited,
            )
        )
    return waiters


def _parked(
    task_ids: list[str], parked: list[Any], entries: list[Any], now_us: int
) -> tuple[Parked, ...]:
    """The parked calls in turn order; the task name from each one's grant holder info
    (``<grant token>\\n<holder info>\\n<the call>``)."""
    found = []
    for position, (task_id, (_, score), entry) in enumerate(
        zip(task_ids, parked, entries or [None] * len(task_ids), strict=True), start=1
    ):
        info: dict[str, Any] = {}
        if isinstance(entry, bytes):
            parts = entry.split(b"\n", 2)
            info = _info(_text(parts[1])) if len(parts) > 1 else {}
        since, waited = _since(float(score), now_us)
        found.append(Parked(position, task_id, _text(info.get("task")), since, waited))
    return tuple(found)


def _follow_up(pending: list[Any]) -> FollowUp | None:
    task_id = _text(pending[0])
    if not task_id:
        return None
    info = _info(_text(pending[1]))
    return FollowUp(task_id, _text(info.get("task")), _text(info.get("host")), _pid(info))


def _throttle(rate: str, got: dict[str, list[Any]], now_ms: int) -> Throttle:
    """The window of ``rate`` as the throttle script would judge a start now: the start at
    rank ``count - limit`` must leave the window before another fits."""
    limit, window_ms = parse_rate(rate)
    count = int(got["starts"][0])
    gate = got["gate"][0]
    wait_ms = 0
    if count >= limit and gate:
        wait_ms = max(1, int(float(gate[0][1])) + window_ms - now_ms)
    return Throttle(
        rate=rate,
        limit=limit,
        window=window_ms / 1000,
        count=count,
        next_start=round((now_ms + wait_ms) / 1000, 3),
        next_start_in=round(wait_ms / 1000, 3),
    )


def _burst(burst: list[Any], got: dict[str, list[Any]], now_ms: int) -> Burst:
    task_id = _text(burst[0]) or ""
    latest = _text(got["burst"][0]) or _text(burst[1]) or "0"
    due = int(float(_text(burst[3]) or 0))
    first = _text(burst[2])
    state = "finished" if got["done"][0] is not None else "open" if due > now_ms else "due"
    return Burst(
        task_id=task_id,
        calls=int(latest) if latest.isdigit() else 0,
        first_call=round(int(float(first)) / 1000, 3) if first else None,
        due=round(due / 1000, 3),
        due_in=round((due - now_ms) / 1000, 3),
        state=state,
    )


def _set_number(value: object) -> int | None:
    """A number set in Redis as the scripts read it: a whole number >= 0, else None."""
    text = _text(value)
    try:
        number = float(text) if text is not None else None
    except ValueError:
        return None
    if number is None or number < 0 or number != int(number):
        return None
    return int(number)


def _limits(
    stack: Stack, got: dict[str, list[Any]], now_ms: int, *, weighed: bool
) -> tuple[LimitUse, ...]:
    """Each stacked limit as the acquire script judges it now (lib/stack.lua): the live
    shares' weights (a member of another layout weighs 1), the number by name, template,
    else code."""
    uses = []
    for limit, shares, numbers, line, alive in zip(
        stack.limits,
        got.get("limit_shares", []),
        got.get("limit_set", []),
        got.get("limit_line", []),
        got.get("limit_alive", []),
        strict=True,
    ):
        used = 0
        for member in shares:
            head = (_text(member) or "").split(":", 1)[0]
            used += int(head) if head.isdigit() and int(head) >= 1 else 1
        by_name, by_template = (_set_number(value) for value in numbers)
        number, source = (
            (by_name, "name")
            if by_name is not None
            else (by_template, "template")
            if by_template is not None
            else (limit.number, "code")
        )
        waiting = 0  # the live places of the line, as the scripts count them
        until = {_text(member): _set_number(value) for member, value in dict(alive).items()}
        for member in line:
            text = _text(member) or ""
            head = text.split(":", 1)[0]
            weight = int(head) if head.isdigit() and int(head) >= 1 else 1
            if (until.get(text) or 0) > now_ms and weight <= number:
                waiting += weight
        uses.append(
            LimitUse(
                limit.name,
                limit.template,
                number,
                source,
                used,
                len(shares),
                stack.weight if weighed else None,
                waiting,
            )
        )
    return tuple(uses)


def _explanation(key: str, now: tuple[int, int], **parts: Any) -> Explanation:
    """The explanation with its states, from what was read."""
    holders: tuple[Held, ...] = parts["holders"]
    live = [held for held in holders if held.live]
    states: list[str] = []
    if live:
        success = all(held.state == "held after success" for held in live)
        states.append("held after success" if success else "held")
    if parts["parked_total"] or parts["handed"]:
        states.append("parked")
    throttle: Throttle | None = parts["throttle"]
    if throttle is not None and throttle.throttled:
        states.append("throttled")
    burst: Burst | None = parts["debounce"]
    if burst is not None and burst.pending:
        states.append("debouncing")
    if any(use.fits is False for use in parts["limits"]):
        states.append("limited")
    return Explanation(key=key, now=round(now[0] / 1000, 3), states=tuple(states), **parts)


class _Locking(Protocol):
    """What :func:`weighed_stack` needs of a task's locking (``runtime.TaskLocking``)."""

    @property
    def options(self) -> LockOptions: ...

    def stack(self, args: Any, kwargs: Any) -> Stack | None: ...


def weighed_stack(locking: _Locking, args: Any, kwargs: Any) -> tuple[Stack | None, str | None]:
    """The stacked limits of a call to explain, and why its ``lock_weight`` failed (None
    when it did not): a weight callable may raise anything, or give no valid weight, and
    an explanation still shows what it can. The stack is then read at a stand-in weight
    (which :func:`explain_key` leaves out). A failure that is not the weight's (a limit
    template that does not render) raises."""
    try:
        return locking.stack(args, kwargs), None
    except Exception as exc:  # a user's lock_weight callable may raise anything
        if not callable(locking.options.weight):
            raise
        options = dataclasses.replace(locking.options, weight=1)
        stand_in: _Locking = dataclasses.replace(cast("Any", locking), options=options)
        stack = stand_in.stack(args, kwargs)  # raises again when the weight was not at fault
        text = " ".join(str(exc).split())
        why = (
            text
            if isinstance(exc, ValueError) and "lock_weight" in text
            else (f"lock_weight raised {type(exc).__name__}: {text}")
        )
        return stack, why


def conflict_explanation(
    client: LockClient,
    key: str,
    options: LockOptions,
    *,
    task: str | None = None,
    stack: Stack | None = None,
) -> dict[str, Any] | None:
    """The explanation of ``key`` as a plain dict, for a ``TaskLocked`` or a skip record:
    read only when a conflict happened (two round trips at most), and never an error of
    its own (None when Redis could not say)."""
    try:
        return explain_key(
            client, key, options, task=task, most=CONFLICT_MOST, stack=stack
        ).as_json()
    except (LockError, ValueError) as exc:
        log.debug("could not explain why %s is held: %s", key, exc)
        return None
