"""Preflight checks of the lock Redis, behind ``celery locks check``.

Each check answers one question an operator asks before trusting the locks to a server:
which server and version it is, whether ``maxmemory-policy`` could evict lock keys, whether
Lua scripting is allowed (and the package's scripts compile there), how far the server's
clock is from this host's, and whether the connecting user may run every command the locks
use, on keys named like the locks' own (so an ACL key pattern that misses the companion
keys ``{...}:signal`` is caught too). Probing writes only short-lived keys of its own
under the prefix and deletes them.

The commands probed are derived, not listed by hand: those the registered Lua scripts call
(``engine.scripts.commands()``) and those the engine sends itself, in the mode configured,
plus the admin tools' own. Each has one probe in :func:`_probe_table`; a unit test fails
when a script starts using a command that has none.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import redis
from celery.exceptions import ImproperlyConfigured
from redis.cluster import RedisCluster

from celery_singleton_lock._observe import skip_record_key
from celery_singleton_lock.client import mask_url, redis_for
from celery_singleton_lock.config import settings_for
from celery_singleton_lock.engine import scripts
from celery_singleton_lock.engine.keyspace import SLOT, SUFFIXES, companion_key
from celery_singleton_lock.engine.wire import LockClient, wait_for_replicas
from celery_singleton_lock.modes.held import holds_back
from celery_singleton_lock.runtime.locking import locking_for

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
        return Check(
            "server",
            FAIL,
            f"{detail}: too old; waiting needs Redis 6.0+ (BLPOP "
            "with a fractional timeout), and 6.2+ is what is tested",
        )
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
            "eviction",
            FAIL,
            f"maxmemory-policy {policy} with maxmemory {maxmemory} bytes: when memory runs "
            f"out Redis evicts {evicts}, and an evicted lock lets a second run in. Set "
            "maxmemory-policy noeviction, or give the locks a Redis of their own",
        )
    return Check(
        "eviction",
        WARN,
        f"maxmemory-policy {policy} evicts {evicts} once a maxmemory limit is set (none is "
        "set now); noeviction is the safe policy for locks",
    )


def _scripting(client: LockClient, wanted: bool) -> Check:
    try:
        shas = [client.script_load(script.source) for script in scripts.SCRIPTS.values()]
        cast("Any", client).evalsha(client.script_load("return 1"), 0)
    except redis.ResponseError as exc:
        if wanted:
            return Check(
                "scripting",
                FAIL,
                f"Lua scripts cannot run ({_why(exc)}); set singleton_lock_scripting = False "
                "to use the plain SETNX/GET/GETSET commands",
            )
        return Check("scripting", OK, f"not available ({_why(exc)}); plain commands configured")
    if wanted:
        return Check("scripting", OK, f"SCRIPT LOAD and EVALSHA allowed; {len(shas)} scripts load")
    return Check(
        "scripting", OK, "available, but singleton_lock_scripting = False uses plain commands"
    )


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


def parking_tasks(app: Celery) -> list[str]:
    """The tasks of ``app`` whose calls are set aside in the lock Redis (``lock_on_conflict``
    park, coalesce or replace) by name; a task whose options are invalid is left to the
    worker to refuse."""
    with contextlib.suppress(Exception):  # a task module that fails to import
        app.loader.import_default_modules()
    parking = []
    for name, task in sorted(app.tasks.items()):
        try:
            locking = locking_for(task)
        except ImproperlyConfigured:
            continue
        if locking is not None and (locking.plan.policy.keeps_calls or holds_back(locking.options)):
            parking.append(name)
    return parking


def _durability(client: LockClient, parking: list[str]) -> Check:
    """A call set aside (parked, or kept as a follow-up) lives only in the lock Redis: warn
    when a restart would lose it."""
    if not parking:
        return Check(
            "durability",
            OK,
            "no task sets calls aside (lock_on_conflict park, coalesce or replace): no call "
            "lives only in the lock Redis",
        )
    named = ", ".join(parking[:3]) + (" ..." if len(parking) > 3 else "")
    replicas = int(client.info("replication").get("connected_slaves", 0) or 0)
    if int(client.info("persistence").get("aof_enabled", 0) or 0):
        return Check(
            "durability", OK, f"append-only file on: calls set aside by {named} outlive a restart"
        )
    if replicas:
        return Check(
            "durability",
            OK,
            f"{replicas} replica(s): calls set aside by {named} "
            "outlive a failover (set lock_replicas to wait for them)",
        )
    save = ""
    with contextlib.suppress(redis.ResponseError):  # CONFIG may be refused to this user
        save = str(dict(cast("Any", client.config_get("save"))).get("save", ""))
    kept = (
        f"snapshots only (save {save!r}): a restart loses the calls set aside since the last one"
        if save
        else "no persistence and no replica: a restart loses every call set aside"
    )
    return Check(
        "durability",
        WARN,
        f"{named} set calls aside in the lock Redis, which has {kept}; "
        "turn on appendonly, or add a replica",
    )


def _why(exc: Exception) -> str:
    """A Redis error in a few words: not permitted, unknown command, or its message."""
    text = str(exc)  # an EXEC refused by the ACL is an EXECABORT that quotes the NOPERM
    if isinstance(exc, redis.exceptions.NoPermissionError) or "NOPERM" in text:
        return "not permitted by the ACL"
    if "unknown command" in text.lower():
        return "unknown command: renamed or disabled"
    return text.splitlines()[0] if text else type(exc).__name__


Probe = Callable[[], object]

#: What the scripted locks send themselves, besides the commands their scripts call
#: (``scripts.commands()``): EVALSHA with SCRIPT LOAD on NOSCRIPT, BLPOP to wait, ZREM / LPOP
#: / DEL to stop waiting, TIME / GET / PTTL to inspect a lock, SET and WAIT for replicas,
#: ZSCORE to ask whether a task id's run of a key finished (the done set).
SCRIPTED_CLIENT_COMMANDS = frozenset(
    {
        "ZSCORE",
        "PING",
        "TIME",
        "GET",
        "PTTL",
        "SET",
        "DEL",
        "ZREM",
        "LPOP",
        "BLPOP",
        "WAIT",
        "SCRIPT LOAD",
        "EVALSHA",
    }
)
#: The plain-command protocol (``scripting=False``, ``engine/plain.py``): SET NX, GET and
#: GETSET under WATCH / MULTI / EXEC (UNWATCH when it stops early), the waiters' queue and
#: wake-ups, and the same waiting, inspecting and replica commands as the scripted locks.
PLAIN_COMMANDS = frozenset(
    {
        "ZSCORE",
        "ZREMRANGEBYSCORE",
        "PING",
        "TIME",
        "SET",
        "GET",
        "GETSET",
        "PTTL",
        "PEXPIRE",
        "SETRANGE",
        "DEL",
        "RPUSH",
        "BLPOP",
        "LPOP",
        "ZADD",
        "ZREM",
        "WATCH",
        "MULTI",
        "EXEC",
        "UNWATCH",
        "WAIT",
    }
)
#: What a run reads to explain a conflict it meets (``TaskLocked.explanation``, the skip
#: record's; ``celery_singleton_lock.explain``), in either mode: one pipeline of reads.
EXPLAIN_COMMANDS = frozenset(
    ("TIME", "GET", "PTTL", "HMGET", "ZCARD", "ZCOUNT", "ZRANGE", "ZRANGEBYSCORE", "ZREVRANGE")
) | {"ZSCORE"}
#: What the admin tools send (``celery locks list`` reads each key's waiters and pending
#: follow-up; ``clear`` marks a cleared slot free in its index; ``locks limit`` reads and
#: sets the numbers of stacked limits and reads their shares); tasks of the plain-command
#: mode do not need it.
ADMIN_COMMANDS = (
    "SCAN",
    "TYPE",
    "ZRANGE",
    "ZCARD",
    "HGET",
    "MGET",
    "ZADD",
    "HGETALL",
    "HSET",
    "HDEL",
    "ZRANGEBYSCORE",
)


def needed_commands(scripting: bool) -> frozenset[str]:
    """Every command the locks send in the given mode (the scripted set is derived from the
    registered scripts, so a script that starts using a command is probed for it)."""
    mode = scripts.commands() | SCRIPTED_CLIENT_COMMANDS if scripting else PLAIN_COMMANDS
    return mode | EXPLAIN_COMMANDS


def _probe_keys(key: str) -> dict[str, str]:
    """The keys the probes touch: ``key`` as the lock key and a companion of each kind."""
    keys = {"": key}
    for name, suffix in SUFFIXES.items():
        keys[name] = companion_key(key, suffix + ("probe" if suffix.endswith(":") else ""))
    keys["SLOT"] = companion_key(key, f"{SLOT}2")
    return keys


def _node(client: LockClient, key: str) -> redis.Redis:
    """The client of the server that holds ``key`` (on a cluster, its node's)."""
    if isinstance(client, RedisCluster):
        any_client = cast("Any", client)  # untyped in redis-py
        node = any_client.get_node_from_key(key)
        return cast("redis.Redis", any_client.get_redis_connection(node))
    return client


def _one_connection(client: LockClient, key: str, *commands: tuple[Any, ...]) -> list[object]:
    """Send ``commands`` one by one on one connection to ``key``'s server, each reply read
    before the next goes (so a refusal names its command); the connection is dropped
    after, so no WATCH or MULTI of a probe outlives it."""
    pipe = cast("Any", _node(client, key).pipeline(transaction=True))  # untyped internals
    try:
        return [pipe.immediate_execute_command(*command) for command in commands]
    finally:
        # Not reset(): it would send UNWATCH after a WATCH, a command of its own to probe.
        connection, pipe.connection, pipe.watching = pipe.connection, None, False
        if connection is not None:
            connection.disconnect()
            pipe.connection_pool.release(connection)


def _probe_table(client: LockClient, key: str) -> dict[str, Probe]:
    """One probe per command the locks or the admin tools use, on keys named like a lock
    and its companions, in an order where each acts on keys the earlier ones made."""
    k = _probe_keys(key)
    lock, queue, signal, pending = k[""], k["QUEUE"], k["SIGNAL"], k["PENDING"]
    any_client = cast("Any", client)  # evalsha and a few replies are untyped in redis-py

    def evalsha() -> object:
        # A script that calls nothing: what scripts call is probed command by command (the
        # ACL judges a command the same inside a script), so a refusal here is EVALSHA's.
        return any_client.evalsha(client.script_load("return #KEYS"), 1, lock)

    def exec_() -> object:
        try:
            _one_connection(client, lock, ("MULTI",))
        except redis.ResponseError:
            return None  # MULTI's own probe says so; EXEC cannot be tried without it
        return _one_connection(client, lock, ("MULTI",), ("EXEC",))

    return {
        "PING": client.ping,
        "TIME": client.time,
        "SET": lambda: client.set(lock, "probe", nx=True, px=_PROBE_MS),
        "GET": lambda: client.get(lock),
        "MGET": lambda: client.mget([lock, k["SLOT"]]),
        "PTTL": lambda: client.pttl(lock),
        "PEXPIRE": lambda: client.pexpire(lock, _PROBE_MS),
        "SETRANGE": lambda: client.setrange(lock, 0, "p"),
        "GETSET": lambda: client.getset(lock, "probe"),
        "RPUSH": lambda: client.rpush(signal, "1"),
        "BLPOP": lambda: client.blpop([signal], timeout=0.01),
        "LPOP": lambda: client.lpop(signal),
        "ZADD": lambda: client.zadd(queue, {"probe": 1}, nx=True),
        "ZCARD": lambda: client.zcard(queue),
        "ZRANGE": lambda: client.zrange(queue, 0, 0, withscores=True),
        "ZRANGEBYSCORE": lambda: client.zrangebyscore(k["SLOTS"], "-inf", 3, start=0, num=1),
        "ZPOPMIN": lambda: client.zpopmin(queue),
        "ZREM": lambda: client.zrem(queue, "probe"),
        "ZREMRANGEBYSCORE": lambda: client.zremrangebyscore(k["STARTS"], "-inf", 0),
        "ZSCORE": lambda: client.zscore(k["DONE"], "probe"),
        "ZRANK": lambda: client.zrank(k["PARKED"], "probe"),
        "ZCOUNT": lambda: client.zcount(k["STARTS"], 0, "+inf"),
        "ZREVRANGE": lambda: client.zrevrange(k["STARTS"], 0, 0),
        "INCR": lambda: cast("Any", client).execute_command("INCR", k["SEQ"]),  # not INCRBY
        "HSET": lambda: client.hset(pending, "id", "probe"),
        "HEXISTS": lambda: client.hexists(pending, "id"),
        "HGET": lambda: client.hget(pending, "id"),
        "HMGET": lambda: client.hmget(pending, ["id", "token"]),
        "HGETALL": lambda: client.hgetall(pending),
        "HDEL": lambda: client.hdel(k["OWNERS"], "probe"),
        "WATCH": lambda: _one_connection(client, lock, ("WATCH", lock)),
        "UNWATCH": lambda: _one_connection(client, lock, ("UNWATCH",)),
        "MULTI": lambda: _one_connection(client, lock, ("MULTI",)),
        "EXEC": exec_,
        "WAIT": lambda: wait_for_replicas(client, lock, k["SYNC"], 0, 10),
        "SCRIPT LOAD": lambda: client.script_load("return 1"),
        "EVALSHA": evalsha,
        "SCAN": lambda: next(iter(client.scan_iter(match=lock, count=10)), None),
        "TYPE": lambda: client.type(lock),
        "DEL": lambda: client.delete(*_probe_keys(key).values()),
    }


def _probes(client: LockClient, key: str, scripting: bool) -> list[tuple[str, Probe, bool]]:
    """(command, call, needed by the locks themselves) for every command the locks of this
    mode and the admin tools use; the others' probes are left out."""
    needed = needed_commands(scripting)
    wanted = needed | set(ADMIN_COMMANDS)
    return [
        (command, probe, command in needed)
        for command, probe in _probe_table(client, key).items()
        if command in wanted
    ]


def _permissions(client: LockClient, prefix: str, scripting: bool) -> list[Check]:
    key = f"{prefix}:celery_singleton_lock.check:{{{uuid.uuid4().hex[:12]}}}"
    refused: list[str] = []
    admin_refused: list[str] = []
    skip_record = skip_record_key(prefix, f"celery_singleton_lock.check.{uuid.uuid4().hex[:12]}")
    try:
        for command, probe, needed in _probes(client, key, scripting):
            try:
                probe()
            except redis.ResponseError as exc:
                (refused if needed else admin_refused).append(f"{command} ({_why(exc)})")
        try:  # a skipped run's record lives outside prefix:* (see skip_info)
            client.set(skip_record, "probe", px=_PROBE_MS)
        except redis.ResponseError as exc:
            refused.append(f"SET on skip records like {skip_record!r} ({_why(exc)})")
    finally:
        with contextlib.suppress(redis.RedisError):  # else they expire within seconds
            client.delete(*_probe_keys(key).values())
            client.delete(skip_record)
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
        admin = Check("admin", OK, "every command `locks list` and `clear` use is allowed")
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
        _guarded("durability", lambda: _durability(client, parking_tasks(app))),
        *_permissions(client, settings.prefix, settings.scripting),
    ]
    return Report(mask_url(settings.url), settings.prefix, settings.scripting, tuple(checks))
