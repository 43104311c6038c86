"""Reading and writing the lock key's value (pure functions; no Redis, no Celery).

The layout is documented in :mod:`.scripts`; this module is the Python twin of the Lua
``scripts/lib/value.lua``, used by the plain-command mode, by ``owned()``/``locked()`` and
by the admin CLI.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MAX_EXACT", "Holder", "LockValue", "format_value", "parse_value"]

# Below this a classic timestamp is in seconds (10^11 s is the year 5138; 10^11 ms is 1973).
_SECONDS_LIMIT = 100_000_000_000
#: The largest number the grammar accepts: every integer up to it is exact as a double,
#: which is what the Lua scripts compute with. A fencing token never goes past it.
MAX_EXACT = 2**53 - 1
# One grammar with the Lua ``parse`` (scripts/lib/value.lua): numbers are 1-16 ASCII digits
# (never Unicode digits) and the whole value must match (no trailing newline); on bytes, so
# a value that is not UTF-8 parses the same as in Lua.
_OURS = re.compile(rb"([0-9]{1,16}):([01]):([^:]*):([0-9]{1,16}):(.*)", re.DOTALL)
_CLASSIC = re.compile(rb"([0-9]{1,16})(?:\.([0-9]{1,16}))?")


@dataclass(frozen=True)
class LockValue:
    """What a lock key holds.

    ``expiry_ms`` is None for a foreign value (neither ours nor a classic timestamp);
    such a key is held while it has a TTL. ``classic`` marks a plain timestamp written by a
    SETNX locker in another language: it has no owner token and no fencing token.
    """

    expiry_ms: int | None
    token: str | None = None
    fence: int | None = None
    waiters: bool = False
    info: str = ""
    classic: bool = False

    def held_at(self, now_ms: int, ttl_ms: int | None = None) -> bool:
        """Whether the lock counts as held at server time ``now_ms``."""
        if self.expiry_ms is None:
            return ttl_ms is not None and ttl_ms > 0
        return self.expiry_ms > now_ms

    def holder(self, now_ms: int, ttl_ms: int | None) -> Holder | None:
        """Who holds the lock at ``now_ms``, or None when nobody does."""
        if not self.held_at(now_ms, ttl_ms):
            return None
        remaining = (self.expiry_ms - now_ms) if self.expiry_ms is not None else ttl_ms
        try:
            info = json.loads(self.info) if self.info else {}
        except ValueError:
            info = {"text": self.info}
        return Holder(
            token=self.token,
            fence=self.fence,
            remaining_ms=remaining,
            info=info if isinstance(info, dict) else {"text": self.info},
            classic=self.classic,
        )


@dataclass(frozen=True)
class Holder:
    """The current holder of a lock as seen by an observer (the CLI, a conflicting task)."""

    token: str | None
    fence: int | None
    remaining_ms: int | None
    info: dict[str, Any] = field(default_factory=dict)
    classic: bool = False

    @property
    def task_id(self) -> str | None:
        """The Celery task id of the holder, when the holder is a task."""
        value = self.info.get("task_id")
        return str(value) if value is not None else None


def parse_value(raw: bytes | str) -> LockValue:
    """Parse a lock value; never raises, whatever the bytes."""
    data = raw.encode("utf-8", "surrogateescape") if isinstance(raw, str) else raw
    ours = _OURS.fullmatch(data)
    if ours:
        expiry, fence = int(ours.group(1)), int(ours.group(4))
        if expiry > MAX_EXACT or fence > MAX_EXACT:
            return LockValue(expiry_ms=None)
        return LockValue(
            expiry_ms=expiry,
            waiters=ours.group(2) == b"1",
            token=ours.group(3).decode("utf-8", "replace"),
            fence=fence,
            info=ours.group(5).decode("utf-8", "replace"),
        )
    classic = _CLASSIC.fullmatch(data)
    if classic and int(classic.group(1)) <= MAX_EXACT:
        number: float = float(data) if classic.group(2) else int(classic.group(1))
        if number < _SECONDS_LIMIT:
            number *= 1000
        return LockValue(expiry_ms=int(number), classic=True)
    return LockValue(expiry_ms=None)


def format_value(expiry_ms: int, waiters: bool, token: str, fence: int, info: str) -> str:
    """The value ``RedisLock`` writes; ``parse_value(format_value(...))`` round-trips."""
    return f"{expiry_ms}:{'1' if waiters else '0'}:{token}:{fence}:{info}"
