"""Preflight checks of the lock Redis, behind ``celery locks check``.

Each check answers one question an operator asks before trusting the locks to a server:
which server and version it is, whether ``maxmemory-policy`` could evict lock keys, whether
Lua scripting is allowed (and the package's scripts compile there), how far the server's
clock is from this host's, and whether the connecting user may run every command the locks
use, on keys named like the locks' own (so an ACL key pattern that misses the companion
keys ``{...}:signal`` is caught too). Probing writes only short-lived keys of its own
under the prefix and deletes them.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import redis

from celery_singleton_lock.client import mask_url, redis_for
from celery_singleton_lock.config import settings_for
from celery_singleton_lock.engine import _scripts
from celery_singleton_lock.engine.keyspace import companion_key
from celery_singleton_lock.engine.wire import LockClient

if TYPE_CHECKING:
    from celery import Celery

__all__ = ["FAIL", "OK", "WARN", "Check", "Report", "run_checks"]

OK, WARN, FAIL = "ok", "warn", "fail"
#: Oldest server the package is tested on, and the oldest it can work on (BLPOP with a
#: fractional timeout, which waiting relies on, came with Redis 6.0).
SUPPORTED = (6, 2)
MINIMUM = (6, 0)
#: A clock further off than this is worth a warning (it never affects exclusion).
CLOCK_WARN_SECONDS = 1.0
_PROBE_MS = 10_000


@dataclass(frozen=True)
class Check:
    """One check's outcome: ``status`` is ``ok``, ``warn`` or ``fail``."""

    name: str
    status: str
    detail: str

    def as_json(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status, "detail": self.detail}


@dataclass(frozen=True)
class Report:
    """Every check of one run, and where it ran."""

    url: str
    prefix: str
    scripting: bool
    checks: tuple[Check, ...]

    @property
    def failures(self) -> int:
        return sum(check.status == FAIL for check in self.checks)

    @property
    def warnings(self) -> int:
        return sum(check.status == WARN for check in self.checks)


def _version(text: str) -> tuple[int, ...]:
    """``"7.0.15"`` as ``(7, 0, 15)``; unparsable parts count as 0."""
    return tuple(int(part) if part.isdigit() else 0 for part in text.split(".")[:3])


def _server(client: LockClient) -> Check:
    info = client.info("server")
    valkey = info.get("valkey_version")
    name, version = ("Valkey", str(valkey)) if valkey else ("Redis", str(info["redis_version"]))
    mode = info.get("redis_mode", "standalone")
    detail = f"{name} {version} ({mode})"
    compatible = _version(str(info["redis_version"]))
    if compatible < MINIMUM:
        return Check("server", FAIL, f"{detail}: too old; waiting needs Redis 6.0+ (BLPOP "
                     "with a fractional timeout), and 6.2+ is what is tested")  # fmt: skip
    if compatible < SUPPORTED:
        return Check("server", WARN, f"{detail}: older than 6.2, the oldest tested")
    return Check("server", OK, detail)


def _eviction(client: LockClient) -> Check:
    info = client.info("memory")
    policy = str(info.get("maxmemory_policy", "unknown"))
    maxmemory = int(info.get("maxmemory", 0) or 0)
    if policy == "noeviction":
        return Check("eviction", OK, "maxmemory-policy noeviction: lock keys are never evicted")
    evicts = "any key" if policy.startswith("allkeys") else "keys with a TTL (every lock key)"
    if maxmemory:
        return Check(
            "eviction", FAIL,
            f"maxmemory-policy {policy} with maxmemory {maxmemory} bytes: when memory runs "
            f"out Redis evicts {evicts}, and an evicted lock lets a second run in. Set "
            "maxmemory-policy noeviction, or give the locks a Redis of their own",
        )  # fmt: skip
    return Check(
        "eviction", WARN,
        f"maxmemory-policy {policy} evicts {evicts} once a maxmemory limit is set (none is "
        "set now); noeviction is the safe policy for locks",
    )  # fmt: skip


def _scripting(client: LockClient, wanted: bool) -> Check:
    try:
        shas = [client.script_load(source) for source in _scripts_sources()]
        cast("Any", client).evalsha(client.script_load("return 1"), 0)
    except redis.ResponseError as exc:
        if wanted:
            return Check(
                "scripting", FAIL,
                f"Lua scripts cannot run ({_why(exc)}); set singleton_lock_scripting = False "
                "to use the plain SETNX/GET/GETSET commands",
            )  # fmt: skip
        return Check("scripting", OK, f"not available ({_why(exc)}); plain commands configured")
    if wanted:
        return Check("scripting", OK, f"SCRIPT LOAD and EVALSHA allowed; {len(shas)} scripts load")
    return Check(
        "scripting", OK, "available, but singleton_lock_scripting = False uses plain commands"
    )


def _scripts_sources() -> tuple[str, ...]:
    return (_scripts.ACQUIRE, _scripts.RELEASE, _scripts.EXTEND)


def _clock(client: LockClient) -> Check:
    before = time.time()
    seconds, micros = client.time()
    after = time.time()
    offset = seconds + micros / 1e6 - (before + after) / 2
    side = "ahead of" if offset >= 0 else "behind"
    detail = (
        f"server clock {abs(offset) * 1000:.0f} ms {side} this host's (round trip "
        f"{(after - before) * 1000:.1f} ms); locks read the server's clock, so this never "
        "affects exclusion"
    )
    if abs(offset) > CLOCK_WARN_SECONDS:
        return Check("clock", WARN, detail + ", but it hints at a host without NTP")
    return Check("clock", OK, detail)


def _why(exc: Exception) -> str:
    """A Redis error in a few words: not permitted, unknown command, or its message."""
    text = str(exc)
    if isinstance(exc, redis.exceptions.NoPermissionError) or text.startswith("NOPERM"):
        return "not permitted by the ACL"
    if "unknown command" in text.lower():
        return "unknown command: renamed or disabled"
    return text.splitlines()[0] if text else type(exc).__name__


Probe = Callable[[], object]


def _probes(client: LockClient, key: str, scripting: bool) -> list[tuple[str, Probe, bool]]:
    """(command, call, needed by the locks themselves) for every command used, in an order
    where each acts on keys the earlier ones made."""
    signal, done = companion_key(key, "signal"), companion_key(key, "done")
    queue = companion_key(key, "queue")
    any_client = cast("Any", client)

    def transaction() -> object:
        with any_client.pipeline(transaction=True) as pipe:
            pipe.watch(key)
            pipe.multi()
            pipe.pexpire(key, _PROBE_MS)
            return pipe.execute()

    def evalsha() -> object:
        return any_client.evalsha(client.script_load("return redis.call('PTTL', KEYS[1])"), 1, key)

    common: list[tuple[str, Probe]] = [
        ("PING", client.ping),
        ("TIME", client.time),
        ("SET", lambda: client.set(key, "probe", nx=True, px=_PROBE_MS)),
        ("GET", lambda: client.get(key)),
        ("PTTL", lambda: client.pttl(key)),
        ("PEXPIRE", lambda: client.pexpire(key, _PROBE_MS)),
        ("RPUSH", lambda: client.rpush(signal, "1")),
        ("BLPOP", lambda: client.blpop([signal], timeout=0.01)),
        ("LPOP", lambda: client.lpop(signal)),
        ("ZADD", lambda: client.zadd(queue, {"probe": 1}, nx=True)),
        ("ZREM", lambda: client.zrem(queue, "probe")),
    ]
    if scripting:
        mode: list[tuple[str, Probe]] = [
            ("SETRANGE", lambda: client.setrange(key, 0, "p")),
            ("ZPOPMIN", lambda: client.zpopmin(queue)),
            ("ZCARD", lambda: client.zcard(queue)),
            ("SCRIPT LOAD", lambda: client.script_load("return 1")),
            ("EVALSHA", evalsha),
        ]
    else:
        mode = [
            ("GETSET", lambda: client.getset(key, "probe")),
            ("WATCH/MULTI/EXEC", transaction),
        ]
    cleanup: list[tuple[str, Probe]] = [
        ("SET (done marker)", lambda: client.set(done, "probe", px=_PROBE_MS)),
        ("DEL", lambda: client.delete(key, signal, done, queue)),
    ]
    admin: list[tuple[str, Probe]] = [
        ("SCAN", lambda: next(iter(client.scan_iter(match=key, count=10)), None)),
        ("TYPE", lambda: client.type(key)),
    ]
    return [(n, f, True) for n, f in [*common, *mode, *cleanup]] + [(n, f, False) for n, f in admin]


def _permissions(client: LockClient, prefix: str, scripting: bool) -> list[Check]:
    key = f"{prefix}:celery_singleton_lock.check:{{{uuid.uuid4().hex[:12]}}}"
    refused: list[str] = []
    admin_refused: list[str] = []
    try:
        for command, probe, needed in _probes(client, key, scripting):
            try:
                probe()
            except redis.ResponseError as exc:
                (refused if needed else admin_refused).append(f"{command} ({_why(exc)})")
    finally:
        with contextlib.suppress(redis.RedisError):  # else they expire within seconds
            client.delete(key, companion_key(key, "signal"), companion_key(key, "done"))
    mode = "scripted" if scripting else "plain-command"
    if refused:
        missing = f"the {mode} locks need, on keys like {key!r}: " + ", ".join(refused)
        permissions = Check("permissions", FAIL, missing)
    else:
        allowed = f"every command the {mode} locks use is allowed on keys like {key!r} and "
        permissions = Check("permissions", OK, allowed + "its companions")
    if admin_refused:
        wanted = "`celery locks list/clear` need " + ", ".join(admin_refused) + " (tasks do not)"
        admin = Check("admin", WARN, wanted)
    else:
        admin = Check("admin", OK, "SCAN and TYPE allowed (`locks list` and `clear`)")
    return [permissions, admin]


def _guarded(name: str, check: Callable[[], Check]) -> Check:
    """Run one check; a refused or unknown command it needs is a warning, not a crash."""
    try:
        return check()
    except redis.ResponseError as exc:
        return Check(name, WARN, f"could not check: {_why(exc)}")


def run_checks(app: Celery) -> Report:
    """Check the lock Redis of ``app``. Connection errors propagate (redis-py's
    ``ConnectionError``/``TimeoutError``); a bad setting is ``ImproperlyConfigured``."""
    settings = settings_for(app)
    client = redis_for(app, settings.url)
    client.ping()
    checks = [
        _guarded("server", lambda: _server(client)),
        _guarded("eviction", lambda: _eviction(client)),
        _guarded("scripting", lambda: _scripting(client, settings.scripting)),
        _guarded("clock", lambda: _clock(client)),
        *_permissions(client, settings.prefix, settings.scripting),
    ]
    return Report(mask_url(settings.url), settings.prefix, settings.scripting, tuple(checks))
