"""``celery locks limit``: the stacked limits of an app (``lock_limits``) as the code gives
them and as they stand in the lock Redis, and the numbers set there at run time.

Every stack key of an app lives under :func:`~.engine.stack.stack_base` of its prefix:

- ``<base>limits``: a hash of numbers set at run time, by a limit's rendered name
  (``"tenant:7"``) or by its template as the code writes it (``"tenant:{tenant_id}"``);
- ``<base>limit:<name>``: the shares held in limit ``name``, a sorted set of
  ``"<weight>:<owner token>"`` scored by the end of each holder's lease (server ms).

The scripts (``engine/scripts/lib/stack.lua``) read a limit's number by its name, then by
its template, then take the code's; a stored value that is not a whole number >= 0 (as
Lua's ``tonumber`` reads it) is skipped. A share whose lease has ended no longer counts,
and a member of another layout counts as weight 1. :func:`read_limits` follows the same
rules, read-only, on the server's clock. A key there that holds a value of another type
(which every take of that limit refuses, naming the key) is reported as a
:class:`KeyProblem` beside the rows it concerns, never stops the others being read. Setting
a number never stops running work: it only holds new runs back until they fit.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from celery_singleton_lock.engine.stack import LIMIT_PREFIX, LIMITS, stack_base
from celery_singleton_lock.engine.wire import LockClient, server_time
from celery_singleton_lock.ops.limit_code import (
    CodeLimit,
    closest,
    code_limits,
    has_fields,
    name_problem,
    renders,
    templates_of,
)

__all__ = [
    "HEADINGS",
    "CodeLimit",
    "KeyProblem",
    "LimitRow",
    "LimitsReading",
    "Number",
    "Usage",
    "build_rows",
    "capacities_key",
    "closest",
    "code_limits",
    "has_fields",
    "limit_key",
    "name_problem",
    "parse_number",
    "read_limits",
    "read_limits_reading",
    "renders",
    "set_limit",
    "templates_of",
    "unset_limit",
]

#: The columns of ``celery locks limit list``.
HEADINGS = ("LIMIT", "CODE", "SET", "APPLIES", "IN USE", "HOLDS", "TASKS")
#: A limit's number: a whole number >= 0, or infinity (a stored ``inf``, which the scripts
#: read as no limit at all).
Number = int | float
#: Keys asked for per SCAN call.
_SCAN_COUNT = 500
#: How much of an ignored stored value a table cell shows.
_SHOWN = 20
_GLOB_SPECIAL = re.compile(r"([\\*?\[\]])")
#: A share's weight, as the scripts read it: the leading digits before a colon.
_WEIGHT = re.compile(rb"(\d+):")
#: What C's ``isspace`` skips around a number (Lua's ``tonumber`` uses ``strtod``).
_C_SPACE = " \t\n\r\f\v"


# ----------------------------------------------------------------------------- Redis


def capacities_key(prefix: str) -> str:
    """The hash of numbers set at run time, of an app with key ``prefix``."""
    return stack_base(prefix) + LIMITS


def limit_key(prefix: str, name: str) -> str:
    """The sorted set of limit ``name``'s shares."""
    return stack_base(prefix) + LIMIT_PREFIX + name


def set_limit(client: LockClient, prefix: str, name: str, number: int) -> None:
    """Set limit (or template) ``name`` to ``number`` at run time."""
    if isinstance(number, bool) or not isinstance(number, int) or number < 0:
        raise ValueError(f"a limit's number must be a whole number >= 0, got {number!r}")
    problem = name_problem(name)
    if problem is not None:
        raise ValueError(problem)
    client.hset(capacities_key(prefix), name, str(number))


def unset_limit(client: LockClient, prefix: str, name: str) -> bool:
    """Remove the number set for ``name``; whether one was set."""
    return bool(client.hdel(capacities_key(prefix), name))


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else value


def parse_number(value: bytes | str | None) -> Number | None:
    """A stored number as the scripts read it (Lua's ``tonumber``, then a whole number >= 0),
    None when they skip it: decimal, exponent and ``0x`` hex forms with blanks around are
    read; ``inf`` reads as infinity (no limit)."""
    if value is None:
        return None
    text = (value.decode("latin-1") if isinstance(value, bytes) else value).split("\0", 1)[0]
    text = text.strip(_C_SPACE)
    if not text or not text.isascii() or "_" in text:
        return None
    unsigned = text.lstrip("+-")
    try:
        number = float.fromhex(text) if unsigned[:2].lower() == "0x" else float(text)
    except ValueError:
        return None
    if math.isnan(number) or number < 0:
        return None
    if math.isinf(number):
        return number
    return int(number) if number.is_integer() else None


@dataclass(frozen=True)
class Usage:
    """The live shares of one limit: the weight they hold and how many there are."""

    in_use: int = 0
    holds: int = 0


def _usage(members: Iterable[tuple[bytes | str, float]]) -> Usage:
    """The live shares' total weight and count; a member not shaped ``<weight>:<token>`` (or
    of weight 0) counts as 1, as in the scripts."""
    in_use = holds = 0
    for member, _ in members:
        raw = member.encode("utf-8", "surrogateescape") if isinstance(member, str) else member
        found = _WEIGHT.match(raw)
        weight = int(found.group(1)) if found else 0
        in_use += weight if weight >= 1 else 1
        holds += 1
    return Usage(in_use, holds)


def _glob_escape(text: str) -> str:
    return _GLOB_SPECIAL.sub(r"\\\1", text)


def _scan(client: LockClient, pattern: str) -> list[bytes | str]:
    """Every key matching ``pattern``, once (SCAN, never KEYS)."""
    seen: dict[bytes | str, None] = {}
    for key in client.scan_iter(match=pattern, count=_SCAN_COUNT):
        seen.setdefault(key, None)
    return list(seen)


@dataclass(frozen=True)
class KeyProblem:
    """A key of the stack that could not be read as what it should be: ``key`` (its full
    name), ``limit`` (the limit whose shares it holds; None for the hash of numbers set) and
    ``problem`` (what is wrong with it, and what follows)."""

    key: str
    problem: str
    limit: str | None = None

    def __str__(self) -> str:
        return f"key {self.key!r} {self.problem}"

    def as_json(self) -> dict[str, Any]:
        """The problem as a JSON object: ``key``, ``limit`` (or null) and ``problem``."""
        return {"key": self.key, "limit": self.limit, "problem": self.problem}


@dataclass(frozen=True)
class LimitsReading:
    """What :func:`read_limits_reading` found: the ``rows``, and the ``problems`` of keys
    that could not be read (each also on the rows it concerns)."""

    rows: list[LimitRow]
    problems: list[KeyProblem]


def _wrong_type(exc: BaseException) -> bool:
    return isinstance(exc, redis.ResponseError) and str(exc).startswith("WRONGTYPE")


def _type_problem(
    client: LockClient, key: bytes | str, wanted: str, limit: str | None
) -> KeyProblem:
    """The problem of ``key``, which holds a value of another type than ``wanted``."""
    try:
        found = _text(client.type(key))
    except redis.RedisError:
        found = "another type of"
    what = "every run that takes this limit" if limit is not None else "every stacked limit"
    return KeyProblem(
        key=_text(key),
        problem=(
            f"holds a {found} value, not {wanted}; {what} fails (naming the key) until it "
            "is deleted"
        ),
        limit=limit,
    )


def read_limits_reading(
    client: LockClient, prefix: str, code: Sequence[CodeLimit]
) -> LimitsReading:
    """The rows of ``locks limit list``: every limit the code names or the lock Redis holds
    (a number set, or shares), with its live use on the server's clock, and the problem of
    every key there that holds a value of another type (its row shows what else is known).
    Read-only: expired shares are left for the scripts to prune."""
    capacities = capacities_key(prefix)
    zsets = stack_base(prefix) + LIMIT_PREFIX
    problems: list[KeyProblem] = []
    try:
        numbers = dict(client.hgetall(capacities))
    except redis.ResponseError as exc:
        if not _wrong_type(exc):
            raise
        numbers = {}
        problems.append(_type_problem(client, capacities, "a hash of limit numbers", None))
    stored: dict[str, bytes | str] = {_text(name): value for name, value in numbers.items()}
    keys = {_text(key)[len(zsets) :]: key for key in _scan(client, _glob_escape(zsets) + "*")}
    now_ms = server_time(client, capacities)[0]
    pipe = client.pipeline(transaction=False)
    names = sorted(keys)
    for name in names:
        pipe.zrangebyscore(keys[name], f"({now_ms}", "+inf", withscores=True)
    usage: dict[str, Usage] = {}
    for name, members in zip(names, pipe.execute(raise_on_error=False), strict=True):
        if not isinstance(members, Exception):
            usage[name] = _usage(members)
        elif _wrong_type(members):
            problems.append(_type_problem(client, keys[name], "a sorted set of shares", name))
        else:
            raise members
    return LimitsReading(build_rows(code, stored, usage, problems), problems)


def read_limits(client: LockClient, prefix: str, code: Sequence[CodeLimit]) -> list[LimitRow]:
    """The rows of :func:`read_limits_reading` (a limit whose key cannot be read has no
    use: ``in_use`` and ``holds`` are None)."""
    return read_limits_reading(client, prefix, code).rows


# ------------------------------------------------------------------------------- rows


def _cell(values: Sequence[Number]) -> str:
    return "|".join(_shown(value) for value in values) or "-"


def _shown(value: Number) -> str:
    return "inf" if isinstance(value, float) else str(value)


def _json(value: Number | None) -> Any:
    return "inf" if isinstance(value, float) else value


@dataclass(frozen=True)
class LimitRow:
    """One limit, or one template, as ``locks limit list`` shows it.

    ``code``: the numbers the code gives it (several when tasks disagree, or when it
    renders several templates); ``stored`` the text set in Redis by this exact name and
    ``set_number`` that as a number (None when none, or when the scripts skip it); ``applies``:
    the number each of its templates' runs meet now (name, then template, then code);
    ``in_use``/``holds``: its live shares (None for a template with fields, which is no
    limit itself: each rendering is, and for a limit whose key cannot be read);
    ``problems``: the keys read for this row that hold a value of another type.
    """

    name: str
    templates: tuple[str, ...] = ()
    code: tuple[int, ...] = ()
    stored: str | None = None
    set_number: Number | None = None
    applies: tuple[Number, ...] = ()
    in_use: int | None = 0
    holds: int | None = 0
    tasks: tuple[str, ...] = ()
    problems: tuple[KeyProblem, ...] = ()

    def cells(self) -> tuple[str, ...]:
        """The row's table cells, in :data:`HEADINGS` order; ``?`` where a key could not be
        read."""
        unread_use = any(problem.limit == self.name for problem in self.problems)
        unread_set = any(problem.limit is None for problem in self.problems)
        if unread_set:
            set_cell = "?"
        elif self.set_number is not None:
            set_cell = _shown(self.set_number)
        elif self.stored is not None:
            shown = self.stored if len(self.stored) <= _SHOWN else self.stored[:_SHOWN] + "..."
            set_cell = f"{shown!r}(ignored)"
        else:
            set_cell = "-"
        return (
            self.name,
            _cell(self.code),
            set_cell,
            _cell(self.applies),
            "?" if unread_use else "-" if self.in_use is None else str(self.in_use),
            "?" if unread_use else "-" if self.holds is None else str(self.holds),
            ", ".join(self.tasks) or "-",
        )

    def as_json(self) -> dict[str, Any]:
        """The row as a JSON object (``code`` and ``applies`` are lists; an infinite number,
        a stored ``inf``, is the string ``"inf"``; ``problems`` a list of
        :meth:`KeyProblem.as_json`)."""
        return {
            "limit": self.name,
            "templates": list(self.templates),
            "code": list(self.code),
            "set": _json(self.set_number),
            "stored": self.stored,
            "applies": [_json(value) for value in self.applies],
            "in_use": self.in_use,
            "holds": self.holds,
            "tasks": list(self.tasks),
            "problems": [problem.as_json() for problem in self.problems],
        }


def build_rows(
    code: Sequence[CodeLimit],
    stored: Mapping[str, bytes | str],
    usage: Mapping[str, Usage],
    problems: Sequence[KeyProblem] = (),
) -> list[LimitRow]:
    """The rows for what the code says (``code``), the numbers set in Redis by name or
    template (``stored``), the live use of each limit found there (``usage``) and the keys
    that could not be read (``problems``: a limit's own, or the hash of numbers, which
    concerns every row), sorted by name. A name is a template of the code, or is matched to
    the templates it renders."""
    templates = tuple(dict.fromkeys(item.template for item in code))
    unread = {problem.limit: problem for problem in problems if problem.limit is not None}
    shared = tuple(problem for problem in problems if problem.limit is None)
    names = sorted({*templates, *stored, *usage, *unread})
    rows = []
    for name in names:
        own = templates_of(name, templates)
        sources = [item for item in code if item.template in own]
        by_name = parse_number(stored.get(name))
        applies: set[Number] = set()
        for item in sources:
            by_template = parse_number(stored.get(item.template))
            chosen = by_name if by_name is not None else by_template
            applies.add(chosen if chosen is not None else item.number)
        if not sources and by_name is not None:
            applies.add(by_name)
        used = usage.get(name)
        if used is None and name not in unread:
            used = Usage(0, 0) if not (name in templates and has_fields(name)) else None
        text = stored.get(name)
        rows.append(
            LimitRow(
                name=name,
                templates=own,
                code=tuple(sorted({item.number for item in sources})),
                stored=None if text is None else _text(text),
                set_number=by_name,
                applies=tuple(sorted(applies)),
                in_use=None if used is None else used.in_use,
                holds=None if used is None else used.holds,
                tasks=tuple(sorted({item.task for item in sources})),
                problems=shared + ((unread[name],) if name in unread else ()),
            )
        )
    return rows
