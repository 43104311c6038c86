"""Calls held back until they fit, kept in the lock Redis rather than in a worker.

A call that a stacked limit (``lock_limits``) holds back under ``lock_on_conflict="park"``
(its key free, a limit full), a park run over its ``lock_rate_limit``, and a queue-scope
call that a limit holds back and that comes back with its hold (``skip``, ``retry``,
``coalesce``, ``replace``) never wait as a retry with a countdown: that is an ETA message a
worker keeps unacknowledged in memory, and a worker that dies with it strands the call until
the broker's visibility timeout (an hour on Redis). Instead, in the step that finds it still
does not fit, the call is kept under the application's stack base in the lock Redis
(``engine.atomic.held_park``), keeping its place in the line of each limit it does not fit
in (so lighter calls do not pass it), and its worker moves on.

A release of a share of any limit wakes a worker's sweep (:mod:`..runtime.sweep`), which
hands out every held call that fits now (its weight in each of its limits, with room left
for the waiters ahead of it) and publishes it under its own task id; a call waiting for its
window is handed out when the window opens. The sweep also runs every few seconds, so a
wake-up that was lost (the releasing process died, a lease ran out, a limit was raised)
costs a few seconds, and a call handed out ``HELD_RESTART`` seconds ago that never started
(the worker that was to publish it died, or its message was lost) is handed out again; a
copy of a call that finished ends without running. A held call is as durable as the lock
Redis, as a parked one is.

An explanation shows the stacked limits of a call (:class:`LimitsFace`): how much of each
is used, by how many holds, the weight waiting in its line, and whether the call fits.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from celery_singleton_lock.engine import atomic
from celery_singleton_lock.engine.constants import STACK_AHEAD
from celery_singleton_lock.engine.stack import stack_base
from celery_singleton_lock.modes.base import HandedCall, Mode
from celery_singleton_lock.modes.face import Asked, Face, Lines, fields, text
from celery_singleton_lock.modes.parking import (
    HEADER_HELD,
    encode_call,
    keep_ms,
    leave_held,
    milliseconds,
)

if TYPE_CHECKING:
    from celery_singleton_lock.modes.base import Run
    from celery_singleton_lock.options import LockOptions

__all__ = [
    "HEADER_HELD",
    "HELD_RESTART",
    "PLACE_KEEP",
    "TRAVEL_KEEP",
    "HoldBack",
    "LimitUse",
    "LimitsFace",
    "hold_back",
    "holds_back",
]

log = logging.getLogger("celery_singleton_lock.task")

#: Seconds a held call handed out may take to start before a sweep hands it out again.
HELD_RESTART = 15.0
#: Seconds a held call's places in the lines of its limits are kept past each look (the
#: sweeps, every few seconds, keep them while the call is held; with no worker sweeping
#: they lapse, and runs that wait in a worker stop leaving room for it).
PLACE_KEEP = 12.0
#: Seconds its places are kept once it is handed out, while its message travels: a call
#: that comes back later than that joins the lines again, at their ends.
TRAVEL_KEEP = 5.0
#: The most held calls one sweep looks at (of those handed out, and of those due).
SWEEP_MOST = 100


def holds_back(options: LockOptions) -> bool:
    """Whether calls of a task with these options can be held back in the lock Redis:
    under park with stacked limits or a rate, or in queue scope with stacked limits under
    a policy whose accepted call comes back (not ``raise`` or ``wait``)."""
    if options.on_conflict == "park":
        return bool(options.limits) or options.rate_limit is not None
    return (
        options.scope == "queue"
        and bool(options.limits)
        and options.on_conflict not in {"raise", "wait"}
    )


def hold_back(run: Run, *, due: float = 0.0) -> bool:
    """Keep ``run``'s call in the lock Redis until it fits: held back by its stacked limits
    (its places in their lines kept), or, with ``due`` > 0, by its rate for ``due`` seconds.
    False when its limits have room now after all (nothing kept: it should try again at
    once). The message that carries it again is published by a worker's sweep."""
    sig = run.task.signature_from_request(run.request)
    call = HandedCall(run.task_id, tuple(sig.args or ()), dict(sig.kwargs or {}), dict(sig.options))
    payload = encode_call(
        run.task.name,
        call,
        key=run.key,
        serializer=run.serializer,
        header=HEADER_HELD,
        headers=run.carried_headers(),
    )
    limit = atomic.held_park(
        run.client,
        stack_base(run.settings.prefix),
        run.task_id,
        key=run.key,
        payload=payload,
        keep_ms=keep_ms(run.options),
        due_ms=milliseconds(due) if due > 0 else 0,
        stack=None if due > 0 else run.lock.stack,
        place=run.lock.claim,
        place_ms=milliseconds(PLACE_KEEP),
    )
    if limit is None:
        return False
    why = f"until {limit!r} has room" if limit else f"{due:.2f} s, until its window opens"
    log.info("%s[%s]: held back %s", run.task.name, run.task_id, why)
    return True


class HoldBack(Mode):
    """A call that was held back in the lock Redis starts: the sweep lets it be (see the
    module docstring)."""

    name = "held"

    @classmethod
    def applies(cls, options: LockOptions) -> bool:
        return holds_back(options)

    def admit(self, run: Run) -> bool:
        if run.header(HEADER_HELD) is not None:
            leave_held(run)
        return True


# ---------------------------------------------------------------- the stacked limits' face


@dataclass(frozen=True)
class LimitUse:
    """One stacked limit of the call (``lock_limits``): its rendered ``name``, the
    ``number`` that applies now (``source`` says where it came from: ``"name"`` or
    ``"template"`` when set in Redis, ``"code"``), the weight ``used`` by ``holds`` live
    shares, the weight ``waiting`` of the runs in its line (room a new run leaves them),
    the call's own ``weight``, and whether it ``fits`` now (both None when the task's
    ``lock_weight`` failed for this call: ``Explanation.weight_error``)."""

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


def _set_number(value: object) -> int | None:
    """A number set in Redis as the scripts read it: a whole number >= 0, else None."""
    found = text(value)
    try:
        number = float(found) if found is not None else None
    except ValueError:
        return None
    if number is None or number < 0 or number != int(number):
        return None
    return int(number)


def _weight_of(member: object) -> int:
    """The weight of a share or a place (``<weight>:<owner token>``; another layout: 1)."""
    head = (text(member) or "").split(":", 1)[0]
    return int(head) if head.isdigit() and int(head) >= 1 else 1


class LimitsFace(Face):
    """``limits``: each stacked limit of the call as the acquire script judges it now
    (``lib/stack.lua``): its live shares, its number (set in Redis by name or template,
    else the code's) and the live places of its line; read in the second round trip,
    beside the key (the stack's keys share its hash slot). ``weight_error`` says why the
    call's weight is unknown. State ``limited``: a limit has no room for the call."""

    suffixes = ()  # the stack's keys live under the application's stack base
    states = ("limited",)
    fields = ("limits", "weight_error")

    def second(self, asked: Asked, first: list[Any], pipe: Any) -> None:
        stack = asked.stack
        if stack is None:
            return
        for limit in stack.limits:
            pipe.zrangebyscore(stack.limit_key(limit.name), f"({asked.now_ms}", "+inf")
            pipe.hmget(stack.capacities, [limit.name, limit.template])
            line = stack.line_key(limit.name)
            pipe.zrange(line, 0, STACK_AHEAD - 1)
            pipe.hgetall(line + ":alive")

    def parts(self, asked: Asked, first: list[Any], second: list[Any]) -> dict[str, Any]:
        stack = asked.stack
        if stack is None:
            return {"limits": (), "weight_error": asked.weight_error}
        uses = []
        for number_of, limit in enumerate(stack.limits):
            shares, numbers, line, alive = second[4 * number_of : 4 * number_of + 4]
            by_name, by_template = (_set_number(value) for value in numbers)
            number, source = (
                (by_name, "name")
                if by_name is not None
                else (by_template, "template")
                if by_template is not None
                else (limit.number, "code")
            )
            until = {text(member): _set_number(value) for member, value in dict(alive).items()}
            waiting = sum(  # the live places of the line, as the scripts count them
                _weight_of(member)
                for member in line
                if (until.get(text(member) or "") or 0) > asked.now_ms
                and _weight_of(member) <= number
            )
            uses.append(
                LimitUse(
                    limit.name,
                    limit.template,
                    number,
                    source,
                    sum(_weight_of(member) for member in shares),
                    len(shares),
                    stack.weight if asked.weight_error is None else None,
                    waiting,
                )
            )
        return {"limits": tuple(uses), "weight_error": asked.weight_error}

    def state_of(self, explanation: Any) -> tuple[str, ...]:
        return ("limited",) if any(use.fits is False for use in explanation.limits) else ()

    def lines(self, explanation: Any) -> Lines:
        lines: Lines = [("Limit", use.describe()) for use in explanation.limits]
        if explanation.weight_error is not None:
            lines.append(("Weight", f"unknown: {explanation.weight_error}"))
        return lines

    def as_json(self, explanation: Any) -> dict[str, Any]:
        found: dict[str, Any] = {
            "limits": [{**fields(use), "fits": use.fits} for use in explanation.limits]
        }
        if explanation.weight_error is not None:
            found["weight_error"] = explanation.weight_error
        return found

    def from_json(self, data: Mapping[str, Any]) -> dict[str, Any]:
        limits = tuple(
            LimitUse(**{name: value for name, value in use.items() if name != "fits"})
            for use in data.get("limits") or ()
        )
        return {"limits": limits, "weight_error": data.get("weight_error")}
