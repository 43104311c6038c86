"""A mode's state face: what a mode keeps beside a lock key in Redis, as an explanation
shows it (:mod:`celery_singleton_lock.explain`).

A face names the companion keys it reads, queues its reads into the explanation's two
pipelined round trips (the first with the lock's own reads; the second with what depends
on the first, or on the server's clock), and turns its replies into its part of the
explanation: fields of ``Explanation``, the states it adds, its lines of text and its
JSON. The explain driver runs every face of :data:`.faces.FACES` in order and never
decodes a mode's state itself.

This module also holds the small decoders faces and the driver share (texts, holder info,
server times), so no face repeats them.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from celery_singleton_lock.engine.keyspace import companion_key

if TYPE_CHECKING:
    from celery_singleton_lock.engine.stack import Stack
    from celery_singleton_lock.options import LockOptions

__all__ = [
    "Asked",
    "Face",
    "Lines",
    "clock",
    "fields",
    "holder_info",
    "listed",
    "pid_of",
    "seconds",
    "since",
    "text",
    "who",
]

#: Labelled lines of an explanation's text: ``[("Parked", "3 parked, in turn order"), ...]``.
Lines = list[tuple[str, str]]


@dataclass(frozen=True)
class Asked:
    """What an explanation is asked about: the lock ``key``, its task's effective
    ``options`` (None: a single lock with no rate), the call's stacked limits ``stack``
    and why its weight is not known (``weight_error``, None when it is), and how many
    items a list shows at most (``most``); ``task``: the task's name. ``now_ms`` and
    ``now_us`` are the server's clock, known from the second round trip on (0 before)."""

    key: str
    options: LockOptions | None
    stack: Stack | None
    most: int
    task: str | None = None
    weight_error: str | None = None
    now_ms: int = 0
    now_us: int = 0

    def companion(self, suffix: str) -> str:
        """The name of the companion key ``suffix`` of the lock."""
        return companion_key(self.key, suffix)


class Face:
    """The state of one mode as an explanation reads and shows it. Every step has a
    default that reads and shows nothing, so a face implements only what it has.

    ``first`` and ``second`` queue reads on a pipeline (``pipe``: a redis-py pipeline,
    untyped because a cluster's differs); the replies come back to ``parts`` in the same
    order, as two lists (the first round trip's, the second's)."""

    #: The companion key suffixes the mode keeps beside a lock (``engine.keyspace``).
    suffixes: ClassVar[tuple[str, ...]] = ()
    #: The states of a key this face can add, in the order they are listed.
    states: ClassVar[tuple[str, ...]] = ()
    #: The fields of ``Explanation`` this face fills.
    fields: ClassVar[tuple[str, ...]] = ()

    def first(self, asked: Asked, pipe: Any) -> None:
        """Queue the reads of the first round trip (the clock is not known yet)."""

    def second(self, asked: Asked, first: list[Any], pipe: Any) -> None:
        """Queue the reads that depend on this face's first replies or on the clock."""

    def parts(self, asked: Asked, first: list[Any], second: list[Any]) -> dict[str, Any]:
        """This face's fields of the explanation, from its replies."""
        return {}

    def state_of(self, explanation: Any) -> tuple[str, ...]:
        """The states this face adds to an explanation (some of :attr:`states`)."""
        return ()

    def lines(self, explanation: Any) -> Lines:
        """This face's lines of the explanation's text."""
        return []

    def as_json(self, explanation: Any) -> dict[str, Any]:
        """This face's fields as JSON values."""
        return {}

    def from_json(self, data: Mapping[str, Any]) -> dict[str, Any]:
        """This face's fields, read back from :meth:`as_json`'s values."""
        return {}


# ------------------------------------------------------------------------ shared decoders


def text(value: object) -> str | None:
    """A reply as text (bytes decoded as UTF-8), None for None."""
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def holder_info(value: str | None) -> dict[str, Any]:
    """Holder info as stored (JSON), ``{}`` when it is not a JSON object."""
    if not value:
        return {}
    try:
        info = json.loads(value)
    except ValueError:
        return {}
    return info if isinstance(info, dict) else {}


def pid_of(info: Mapping[str, Any]) -> int | None:
    pid = info.get("pid")
    return pid if isinstance(pid, int) and not isinstance(pid, bool) else None


def since(micros: float | None, now_us: int) -> tuple[float | None, float | None]:
    """(Unix seconds, seconds ago) of a server time in microseconds, when plausible."""
    if micros is None or not 0 < micros <= now_us:
        return None, None
    return round(micros / 1_000_000, 6), round((now_us - micros) / 1_000_000, 3)


def who(task: str | None, task_id: str | None, host: str | None, pid: int | None) -> str:
    """``shop.buy[<id>] on host/pid``, as far as it is known."""
    name = f"{task or 'task'}[{task_id}]" if task_id else (task or "not a task")
    where = "/".join(str(part) for part in (host, pid) if part is not None)
    return f"{name} on {where}" if where else name


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def clock(unix: float | None) -> str:
    """A server time as the text shows it: ``10:41:07 UTC``."""
    if unix is None:
        return "-"
    moment = datetime.datetime.fromtimestamp(unix, tz=datetime.timezone.utc)
    return moment.strftime("%H:%M:%S UTC")


def fields(part: Any) -> dict[str, Any]:
    """A part's dataclass fields as a dict (its JSON)."""
    return {name: getattr(part, name) for name in part.__dataclass_fields__}


def listed(lines: Lines, label: str, total: int, items: Any, what: str) -> None:
    """``Waiters  3, in turn order`` and one line per item listed (and how many are not)."""
    if not total and not items:
        return
    lines.append((label, f"{total} {what}, in turn order"))
    lines.extend(("", item.describe()) for item in items)
    if total > len(items):
        lines.append(("", f"... and {total - len(items)} more"))
