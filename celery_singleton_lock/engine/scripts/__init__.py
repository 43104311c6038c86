"""The Lua scripts of the lock engine, run atomically on the Redis server: one ``.lua`` file
per script, each headed by its KEYS / ARGV / return contract, and shared helpers under
``lib/``, each defined once. This package renders them once, at import, and registers them
in :data:`SCRIPTS`; only the engine runs them (:mod:`..scripted` for the lock itself,
:mod:`..atomic` for the modes).

Rendering: a line ``--@include NAME`` becomes the text of ``lib/NAME.lua`` (rendered the
same way; each include appears once per script, where it is first asked for), and every
``${NAME}`` becomes its value: a constant of :mod:`..constants`, ``MAX_EXACT`` of
:mod:`..value`, ``K_<NAME>`` for the companion-key suffix ``keyspace.SUFFIXES[NAME]``, or
``S_<NAME>`` for the suffix ``stack.STACK_SUFFIXES[NAME]`` of a key under a stack's base.
An unknown name or include fails the import. The includes:

- ``clock``: ``clock()`` -> server now in ms, in µs, and the TIME reply;
- ``value``: ``parse`` (the grammar of :func:`..value.parse_value`), ``fields`` and
  ``format_value``, the one builder of a lock value;
- ``owner``: ``owned(value, token)``, the owner-token check;
- ``base``: ``base(lock key)`` (:func:`..keyspace.base_key`) and ``base_of(key, suffix)``;
- ``lease``: ``key_ttl(lease)``, the TTL of a leased key (:func:`..protocol.grace_ms`);
- ``waiters``: ``leave(base, queue, token)``, a queued waiter that got the lock;
- ``held``: ``held(key, now)``, whether a lock is held at server time now (and its value);
- ``pending``: ``pend``, the pending follow-up of coalesce / replace (with ``held``);
- ``write``: ``write(key, token, fence, info, now, lease)``, a lock written for a new owner;
- ``stack``: stacked limits (``RedisLock(stack=...)``): a hold's weighted shares of several
  limits, taken with its key or not at all, and the lines of the runs waiting for room;
- ``held``: the calls a limit or a rate holds back, kept under the stack's base until they
  fit, and the wake-up a release of a share gives a worker's sweep of them.

Lock value layout (``:`` separated, holder info last)::

    <expiry ms>:<flag>:<owner token>:<fencing token>:<holder info>

``expiry`` is Redis server time in milliseconds at which the lease ends. ``flag`` is ``1``
once a waiter has seen the lock held (so the release must hand the lock over or wake
waiters) and ``0`` otherwise.

Waiters queue up beside the lock, in its hash slot: ``<base>queue`` is a sorted set of their
owner tokens in the order they came (score: server microseconds at their first try), and
``<base>waiter:<token>`` holds ``"<lease ms>:<holder info>"`` for as long as that waiter is
known to be blocked (its TTL: the time it blocks between tries, plus a slack). A release
hands the lock straight to the first queued waiter whose key still exists: it writes the
lock for that waiter and pushes ``"<fencing token>:<expiry ms>:<lock or slot key>"`` onto
the waiter's grant list ``<base>grant:<token>``, which the waiter is blocked on, so the
waiter owns it without another round trip. Waiters whose key lapsed (gone, or about to try
again) are dropped as the queue is read.

At ``maxmemory`` (noeviction) Redis refuses a script's writes that may need memory until the
script has written once: so each script that must work there (release, extend, hold,
throttle, hand-over) makes a write that never needs memory first (``DEL``, ``PEXPIRE``,
``ZPOPMIN``, ``ZREMRANGEBYSCORE``). The scripts carry no ``#!lua`` shebang on purpose: with
one, Redis would judge them by their declared flags and refuse them outright at maxmemory.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from importlib import resources
from types import MappingProxyType
from typing import Any, NamedTuple, cast

import redis

from celery_singleton_lock.engine import constants
from celery_singleton_lock.engine.keyspace import SUFFIXES
from celery_singleton_lock.engine.stack import STACK_SUFFIXES
from celery_singleton_lock.engine.value import MAX_EXACT
from celery_singleton_lock.engine.wire import LockClient

__all__ = ["SCRIPTS", "Arity", "Script", "arity", "commands", "contract", "include"]

_FILES = resources.files(__name__)
_INCLUDE = re.compile(r"^--@include[ \t]+(\w+)[ \t]*$", re.MULTILINE)
_PLACEHOLDER = re.compile(r"\$\{(\w+)\}")
# Every Redis call of a script names its command literally, so the list is exact.
_ANY_CALL = re.compile(r"redis\.p?call\s*\(")
_NAMED_CALL = re.compile(r"redis\.p?call\s*\(\s*'([A-Za-z]+)'")
_COMMENT = re.compile(r"--[^\n]*")


def _values() -> dict[str, str]:
    """What each ``${NAME}`` stands for."""
    values = {name: str(getattr(constants, name)) for name in constants.__all__}
    values["MAX_EXACT"] = str(MAX_EXACT)
    for name, suffix in SUFFIXES.items():
        if not re.fullmatch(r"[a-z:]+", suffix):  # written inside Lua quotes
            raise ValueError(f"companion-key suffix {suffix!r} cannot be written into Lua")
        values[f"K_{name}"] = suffix
    for name, suffix in STACK_SUFFIXES.items():
        if not re.fullmatch(r"[a-z:]+", suffix):
            raise ValueError(f"stack key suffix {suffix!r} cannot be written into Lua")
        values[f"S_{name}"] = suffix
    return values


_VALUES = _values()


def _substitute(text: str, where: str) -> str:
    def value(match: re.Match[str]) -> str:
        try:
            return _VALUES[match.group(1)]
        except KeyError:
            raise ValueError(f"{where}: unknown placeholder {match.group(0)}") from None

    return _PLACEHOLDER.sub(value, text)


def _expand(path: str, seen: set[str]) -> str:
    """The text of ``path`` with its includes written in (those not in ``seen`` yet)."""
    text = _FILES.joinpath(path).read_text(encoding="utf-8")

    def expand(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in seen:
            return f"-- (include {name}: above)"
        seen.add(name)
        return _expand(f"lib/{name}.lua", seen).rstrip("\n")

    return _INCLUDE.sub(expand, text)


def _render(path: str) -> str:
    return _substitute(_expand(path, set()), path)


def include(name: str) -> str:
    """The rendered text of include ``lib/<name>.lua`` (with the includes it asks for), to
    build a script of one's own on it, e.g. a test running ``parse``."""
    return _render(f"lib/{name}.lua")


def contract(name: str) -> str:
    """The contract that heads script ``name``: its leading ``--`` comment lines (up to its
    first include or line of code), comment marks taken off and every ``${NAME}`` written
    in. docs/design.md shows these, generated (``make docs-gen``)."""
    lines = []
    for line in _FILES.joinpath(f"{name}.lua").read_text(encoding="utf-8").splitlines():
        if not line.startswith("--") or _INCLUDE.match(line):
            break
        lines.append(line[3:] if line.startswith("-- ") else line[2:])
    return _substitute("\n".join(lines), f"{name}.lua") + "\n"


class Arity(NamedTuple):
    """How many KEYS or ARGV a contract allows: at least ``low``, at most ``high``."""

    low: int
    high: int


def arity(text: str, kind: str) -> Arity:
    """How many ``kind`` (``"KEYS"`` or ``"ARGV"``) the contract ``text`` names: up to the
    highest index (``ARGV[1..8]`` counts to 8); every one below the first marked
    ``(optional ...)`` or ``(with KEYS[n] ...)`` is required."""
    indices = [int(i) for i in re.findall(rf"{kind}\[(\d+)\]", text)]
    indices += [int(high) for _, high in re.findall(rf"{kind}\[(\d+)\.\.(\d+)\]", text)]
    if not indices:
        return Arity(0, 0)
    optional = re.findall(rf"{kind}\[(\d+)\](?:,\s*{kind}\[\d+\])*\s*\((?:optional|with )", text)
    high = max(indices)
    return Arity(min(int(index) for index in optional) - 1 if optional else high, high)


def _commands(name: str, source: str) -> frozenset[str]:
    """The Redis commands ``source`` calls, each named literally in a call or pcall."""
    code = _COMMENT.sub("", source)
    found = _NAMED_CALL.findall(code)
    if len(found) != len(_ANY_CALL.findall(code)):
        raise ValueError(f"script {name}: every call must name its Redis command literally")
    return frozenset(command.upper() for command in found)


class Script:
    """One registered script: its ``name``, rendered ``source``, its ``sha`` (how Redis
    names it) and the Redis ``commands`` it calls. Calling it runs EVALSHA with
    already-encoded arguments, loading the script on NOSCRIPT (a restarted or failed-over
    server).

    Calling ``execute_command`` directly (rather than redis-py's ``Script`` wrapper) keeps
    the hot path to one packing of already-encoded bytes.
    """

    __slots__ = ("commands", "name", "sha", "source")

    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()  # noqa: S324 - Redis names scripts by SHA1
        self.commands = _commands(name, source)

    def __call__(self, client: LockClient, numkeys: int, *args: bytes | int | str) -> Any:
        execute = cast("Any", client).execute_command  # untyped on RedisCluster
        try:
            return execute("EVALSHA", self.sha, numkeys, *args)
        except redis.exceptions.NoScriptError:
            client.script_load(self.source)
            return execute("EVALSHA", self.sha, numkeys, *args)

    def __repr__(self) -> str:
        return f"<Script {self.name} {self.sha[:12]}>"


def _register() -> Mapping[str, Script]:
    names = sorted(
        entry.name.removesuffix(".lua")
        for entry in _FILES.iterdir()
        if entry.is_file() and entry.name.endswith(".lua")
    )
    return MappingProxyType({name: Script(name, _render(f"{name}.lua")) for name in names})


#: Every script of the engine, by name (the ``.lua`` file's name): acquire, acquire_slots,
#: release, extend, throttle, hold, followup_call, followup_hand_over, followup_replace,
#: debounce_join, debounce_run, the park and order scripts, stack_line, the scripts of
#: held-back calls (held_park, held_sweep, held_started), and the beat group's beat_claim,
#: beat_settle and beat_presence.
SCRIPTS: Mapping[str, Script] = _register()


def commands() -> frozenset[str]:
    """Every Redis command the engine's scripts call (what an ACL user must be allowed
    besides EVALSHA and SCRIPT LOAD)."""
    return frozenset().union(*(script.commands for script in SCRIPTS.values()))
