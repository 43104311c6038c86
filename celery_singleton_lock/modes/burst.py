"""The state of ``lock_debounce`` (:mod:`.debounce`): the key's open burst
``<base>debounce`` (a hash of its task id, generation, first call and due time, server
ms), the burst's latest generation ``<base>burst:<id>`` and whether its run finished (its
task id in ``<base>done``), as an explanation shows it.

It lives beside :mod:`.debounce`, not in it, because the explanation that a conflict
policy attaches to ``TaskLocked`` reads every mode's state, and :mod:`.debounce` stands on
the policies: this module stands on nothing but the face protocol.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from celery_singleton_lock.engine.keyspace import BURST, DEBOUNCE, DONE
from celery_singleton_lock.modes.face import Asked, Face, Lines, clock, fields, seconds, text

__all__ = ["Burst", "BurstFace"]


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
            return text + f"runs in {seconds(self.due_in)} (at {clock(self.due)})"
        if self.state == "due":
            return text + f"due {seconds(-self.due_in)} ago, waiting for its run"
        return text + "finished"


class BurstFace(Face):
    """``debounce``: the open burst, None when there is none; state ``debouncing``."""

    suffixes = (DEBOUNCE, BURST, DONE)
    states = ("debouncing",)
    fields = ("debounce",)

    def first(self, asked: Asked, pipe: Any) -> None:
        pipe.hmget(asked.companion(DEBOUNCE), ["id", "gen", "first", "due"])

    def second(self, asked: Asked, first: list[Any], pipe: Any) -> None:
        burst_id = text(first[0][0])
        if burst_id:
            pipe.get(asked.companion(BURST + burst_id))
            pipe.zscore(asked.companion(DONE), burst_id)

    def parts(self, asked: Asked, first: list[Any], second: list[Any]) -> dict[str, Any]:
        burst = first[0]
        task_id = text(burst[0])
        if not task_id:
            return {"debounce": None}
        latest_generation, done = second
        latest = text(latest_generation) or text(burst[1]) or "0"
        due = int(float(text(burst[3]) or 0))
        first_call = text(burst[2])
        now_ms = asked.now_ms
        state = "finished" if done is not None else "open" if due > now_ms else "due"
        found = Burst(
            task_id=task_id,
            calls=int(latest) if latest.isdigit() else 0,
            first_call=round(int(float(first_call)) / 1000, 3) if first_call else None,
            due=round(due / 1000, 3),
            due_in=round((due - now_ms) / 1000, 3),
            state=state,
        )
        return {"debounce": found}

    def state_of(self, explanation: Any) -> tuple[str, ...]:
        burst = explanation.debounce
        return ("debouncing",) if burst is not None and burst.pending else ()

    def lines(self, explanation: Any) -> Lines:
        burst = explanation.debounce
        return [("Debounce", burst.describe())] if burst is not None else []

    def as_json(self, explanation: Any) -> dict[str, Any]:
        burst = explanation.debounce
        return {"debounce": fields(burst) if burst is not None else None}

    def from_json(self, data: Mapping[str, Any]) -> dict[str, Any]:
        found = data.get("debounce")
        return {"debounce": Burst(**found) if found else None}
