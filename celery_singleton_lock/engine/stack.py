"""Stacked limits: a hold of a lock that also takes a share of several counted limits at
once (``RedisLock(stack=...)``), e.g. at most 5 runs per tenant and 50 in all, with heavy
holds counting more. The scripts do the work (``scripts/lib/stack.lua``); this module names
the keys and builds the spec they read. It imports nothing but the standard library.

Every key of a stack, and the lock key itself, carries one hash tag (the stack's *tag*), so
that the acquire that takes the lock and every share is one script on one Redis Cluster
slot. The keys under a base ``<prefix>:{<tag>}:``:

- ``limit:<name>``: the shares held in limit ``name``, a sorted set of
  ``"<weight>:<owner token>"`` scored by the end of each holder's lease;
- ``wake:<name>``: a short-lived list a release of a share pushes onto, so that a waiter
  held back by that limit tries again at once;
- ``line:<name>`` (and ``line:<name>:alive``): the runs waiting for room in limit ``name``,
  in the order they first tried, and until when each is known to wait; a take leaves room
  for the weight of the waiters ahead of it, so a heavy run is never passed for ever;
- ``limits``: a hash of numbers set at run time (``celery locks limit set NAME N``), by a
  limit's name or by its template, read before the number in the code;
- ``held``, ``held:calls``, ``held:out`` and ``held:wake``: the calls of the application
  that a limit (or a rate) holds back, kept here rather than in a worker until they fit
  (``scripts/lib/holdback.lua``; the task layer's :mod:`celery_singleton_lock.modes.held`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

__all__ = [
    "HELD",
    "HELD_CALLS",
    "HELD_OUT",
    "HELD_WAKE",
    "LIMITS",
    "LIMIT_PREFIX",
    "LINE_PREFIX",
    "MAX_NAME",
    "STACK_SUFFIXES",
    "WAKE_PREFIX",
    "Limit",
    "Stack",
    "hash_tag",
    "is_stacked",
    "stack_base",
]

#: The hash of limit numbers set at run time, under a stack's base.
LIMITS = "limits"
#: ``limit:<name>``: a limit's shares, under a stack's base.
LIMIT_PREFIX = "limit:"
#: ``wake:<name>``: a limit's wake-up list, under a stack's base.
WAKE_PREFIX = "wake:"
#: ``line:<name>``: the waiters of a limit, under a stack's base.
LINE_PREFIX = "line:"
#: ``held``: the calls held back until they fit, a sorted set of task ids scored by the
#: server ms from which each is due (its window opens; a call held back by a limit is due
#: at once, and goes when it fits).
HELD = "held"
#: ``held:calls``: what each held-back call is (a hash: task id -> its lock key, its stack
#: and place in the limits' lines, and the call itself).
HELD_CALLS = "held:calls"
#: ``held:out``: held-back calls handed out for publishing but not started yet (a sorted
#: set scored by server ms), handed out again by a sweep if they never start.
HELD_OUT = "held:out"
#: ``held:wake``: the list a release of a share (or a newly held call) pushes onto, so a
#: worker's sweep looks at the held-back calls at once.
HELD_WAKE = "held:wake"
#: The suffixes of a stack's base the Lua scripts know (``S_<NAME>``).
STACK_SUFFIXES = {
    "LIMITS": LIMITS,
    "HELD": HELD,
    "HELD_CALLS": HELD_CALLS,
    "HELD_OUT": HELD_OUT,
    "HELD_WAKE": HELD_WAKE,
}
#: How the hash tag of every stack ends: ``{<prefix>:stack}``.
TAG_SUFFIX = ":stack"
#: The longest limit name (a longer rendered name is shortened to a digest by the caller).
MAX_NAME = 200


def hash_tag(key: str) -> str | None:
    """The Redis Cluster hash tag of ``key`` (what its slot is computed from), None when the
    whole key is hashed."""
    start = key.find("{")
    if start == -1:
        return None
    end = key.find("}", start + 1)
    return key[start + 1 : end] if end > start + 1 else None


def stack_base(prefix: str) -> str:
    """The base of every stack key of an application whose keys start with ``prefix``:
    ``<prefix>:{<prefix>:stack}:``. One tag per application: a global limit is shared by
    every run of every task, so all its keys must sit in one slot."""
    if "{" in prefix or "}" in prefix:
        raise ValueError(f"a stack prefix cannot contain braces, got {prefix!r}")
    return f"{prefix}:{{{prefix}{TAG_SUFFIX}}}:"


def is_stacked(name: str) -> bool:
    """Whether lock ``name`` is the key of a lock with stacked limits (its hash tag is a
    stack's): its holds may have shares, so every release and extension of it, whoever
    sends it (a lost run's cleanup, ``locks reap``), looks for them. No other lock's
    script ever reads a share's record."""
    return (hash_tag(name) or "").endswith(TAG_SUFFIX)


@dataclass(frozen=True)
class Limit:
    """One limit of a stack: its rendered ``name`` (``"tenant:7"``), the ``template`` it came
    from (``"tenant:{tenant_id}"``; the name itself for a fixed one) and the ``number`` the
    code gives it."""

    name: str
    template: str
    number: int

    def __post_init__(self) -> None:
        if not self.name or len(self.name) > MAX_NAME:
            raise ValueError(f"a limit name must have 1 to {MAX_NAME} characters: {self.name!r}")
        if isinstance(self.number, bool) or not isinstance(self.number, int) or self.number < 0:
            raise ValueError(f"limit {self.template!r}: its number must be an int >= 0")


@dataclass(frozen=True)
class Stack:
    """The limits a hold takes a share of, each of ``weight``, under ``base``
    (:func:`stack_base`)."""

    base: str
    limits: tuple[Limit, ...]
    weight: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.weight, bool) or not isinstance(self.weight, int) or self.weight < 1:
            raise ValueError(f"a stack's weight must be an int >= 1, got {self.weight!r}")
        if not self.limits:
            raise ValueError("a stack needs at least one limit")
        names = [limit.name for limit in self.limits]
        if len(set(names)) != len(names):
            raise ValueError(f"a stack names a limit twice: {names!r}")
        if hash_tag(self.base) is None:
            raise ValueError(f"a stack's base must carry a hash tag, got {self.base!r}")

    @property
    def tag(self) -> str:
        """The hash tag every key of the stack, and its lock's key, carries."""
        return hash_tag(self.base) or ""

    @property
    def capacities(self) -> str:
        """The hash of numbers set at run time."""
        return self.base + LIMITS

    def limit_key(self, name: str) -> str:
        """The sorted set of limit ``name``'s shares."""
        return self.base + LIMIT_PREFIX + name

    def wake_key(self, name: str) -> str:
        """The wake-up list of limit ``name``."""
        return self.base + WAKE_PREFIX + name

    def line_key(self, name: str) -> str:
        """The line of runs waiting for room in limit ``name``."""
        return self.base + LINE_PREFIX + name

    def spec(self) -> str:
        """The JSON the scripts read (``scripts/lib/stack.lua``)."""
        return json.dumps(
            {
                "w": self.weight,
                "c": self.capacities,
                "l": [
                    [
                        self.limit_key(limit.name),
                        limit.name,
                        limit.template,
                        limit.number,
                        self.wake_key(limit.name),
                        self.line_key(limit.name),
                    ]
                    for limit in self.limits
                ],
            },
            separators=(",", ":"),
        )

    def check_lock(self, name: str) -> None:
        """``ValueError`` unless lock ``name`` shares the stack's hash tag (else its acquire
        could not take the shares in the same step on Redis Cluster)."""
        if hash_tag(name) != self.tag:
            raise ValueError(
                f"lock {name!r} must carry the stack's hash tag {{{self.tag}}} to take its "
                "limits in one step"
            )
