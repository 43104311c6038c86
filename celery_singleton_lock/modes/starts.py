"""The state of ``lock_rate_limit`` (:mod:`.throttle`): the key's recent starts
``<base>starts``, a sorted set of run ids scored by the server time each started (ms), as
an explanation shows it: how many starts the window holds and when the next one is free.

It lives beside :mod:`.throttle`, not in it, because the explanation that a conflict
policy attaches to ``TaskLocked`` reads every mode's state, and :mod:`.throttle` stands on
the policies: this module stands on nothing but the face protocol.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from celery_singleton_lock.engine.keyspace import STARTS
from celery_singleton_lock.modes.face import Asked, Face, Lines, fields, seconds
from celery_singleton_lock.options import parse_rate

__all__ = ["StartsFace", "Throttle"]


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
            return text + f"; next free start in {seconds(self.next_start_in)}"
        return text + "; a start is free now"


class StartsFace(Face):
    """``throttle``: the window of the task's ``lock_rate_limit`` (None without one), read
    on the server's clock in the second round trip; state ``throttled``."""

    suffixes = (STARTS,)
    states = ("throttled",)
    fields = ("throttle",)

    @staticmethod
    def _rate(asked: Asked) -> str | None:
        return asked.options.rate_limit if asked.options is not None else None

    def second(self, asked: Asked, first: list[Any], pipe: Any) -> None:
        rate = self._rate(asked)
        if rate is not None:
            limit, window_ms = parse_rate(rate)
            starts = asked.companion(STARTS)
            pipe.zcount(starts, f"({asked.now_ms - window_ms}", "+inf")
            pipe.zrevrange(starts, limit - 1, limit - 1, withscores=True)

    def parts(self, asked: Asked, first: list[Any], second: list[Any]) -> dict[str, Any]:
        """The window as the throttle script would judge a start now: the start at rank
        ``count - limit`` must leave the window before another fits."""
        rate = self._rate(asked)
        if rate is None:
            return {"throttle": None}
        limit, window_ms = parse_rate(rate)
        count, gate = int(second[0]), second[1]
        wait_ms = 0
        if count >= limit and gate:
            wait_ms = max(1, int(float(gate[0][1])) + window_ms - asked.now_ms)
        throttle = Throttle(
            rate=rate,
            limit=limit,
            window=window_ms / 1000,
            count=count,
            next_start=round((asked.now_ms + wait_ms) / 1000, 3),
            next_start_in=round(wait_ms / 1000, 3),
        )
        return {"throttle": throttle}

    def state_of(self, explanation: Any) -> tuple[str, ...]:
        throttle = explanation.throttle
        return ("throttled",) if throttle is not None and throttle.throttled else ()

    def lines(self, explanation: Any) -> Lines:
        throttle = explanation.throttle
        return [("Throttle", throttle.describe())] if throttle is not None else []

    def as_json(self, explanation: Any) -> dict[str, Any]:
        throttle = explanation.throttle
        return {"throttle": fields(throttle) if throttle is not None else None}

    def from_json(self, data: Mapping[str, Any]) -> dict[str, Any]:
        found = data.get("throttle")
        return {"throttle": Throttle(**found) if found else None}
