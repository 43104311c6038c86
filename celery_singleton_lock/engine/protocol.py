"""The seam between ``RedisLock`` and the wire: one small interface, two protocols.

``RedisLock`` decides *when* to acquire, wait, extend and release; a :class:`Protocol` makes
the single round trip (or the WATCH transaction) that does it. ``scripted`` runs the Lua
scripts of ``scripts``; ``plain`` runs the classic SETNX / GET / GETSET commands for
servers where EVAL is disabled. Both write and read the same value (``value``), so locks of
either mode exclude each other.

The parts without a client — the keys of the waiters' queue (:class:`LockKeys`) and what a
waiter's BLPOP or a cancelled wait brought — are shared with the asyncio protocol
(:mod:`.aio_protocol`), which awaits the same calls.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, NamedTuple, cast

from redis.cluster import RedisCluster

from celery_singleton_lock.engine.constants import GRACE_BASE_MS, GRACE_FRACTION, SIGNAL_TTL_MS
from celery_singleton_lock.engine.keyspace import (
    GRANT,
    OWNERS,
    QUEUE,
    SLOTS,
    SYNC,
    WAITER,
    base_key,
)
from celery_singleton_lock.engine.stack import Stack, is_stacked
from celery_singleton_lock.engine.wire import (
    LockClient,
    call,
    server_time,
    time_reply,
    wait_for_replicas,
)

__all__ = [
    "GRACE_BASE_MS",
    "GRACE_FRACTION",
    "SIGNAL_TTL_MS",
    "Attempt",
    "Grant",
    "LockKeys",
    "Protocol",
    "cancel_commands",
    "cancelled",
    "grace_ms",
    "granted_to",
    "parse_grant",
    "popped_grant",
    "read_commands",
]


class Grant(NamedTuple):
    """A lock handed to a waiter: its fencing token, and the key it holds (the lock key,
    or one of its slots)."""

    fence: int
    key: str | None


def parse_grant(grant: bytes | str) -> Grant:
    """A grant as a release pushes it: ``"<fencing token>:<expiry ms>[:<key>]"``."""
    text = grant.decode() if isinstance(grant, bytes) else grant
    parts = text.split(":", 2)
    return Grant(int(parts[0]), parts[2] if len(parts) > 2 else None)


def grace_ms(lease_ms: int) -> int:
    """How long the key outlives a lease of ``lease_ms``."""
    return GRACE_BASE_MS + lease_ms // GRACE_FRACTION


class Attempt(NamedTuple):
    """The outcome of one acquire attempt: ``acquired`` with the hold's fencing token in
    ``number`` (and the slot it took, with several), or not, with the milliseconds until
    the current holder's lease ends (or, held back by a stacked ``limit``, until a share of
    it ends)."""

    acquired: bool
    number: int
    key: str | None = None
    #: The stacked limit that held it back (its key was free), None otherwise.
    limit: str | None = None
    #: Not taken: the key's record says the run of the ``unless_finished`` task id finished.
    finished: bool = False


def popped_grant(reply: Any, grant_key: str) -> Grant | None:
    """What a waiter's ``BLPOP <grant list> <signal list>`` brought: the grant when the
    release handed the lock to it (it then holds it), None after a wake-up or a timeout."""
    if not reply:
        return None
    key, value = cast("tuple[bytes | str, bytes | str]", reply)
    if (key.decode() if isinstance(key, bytes) else key) != grant_key:
        return None  # a wake-up: try again
    return parse_grant(value)


def cancel_commands(pipe: Any, keys: LockKeys, token: str) -> None:
    """Queue on ``pipe`` (a non-transactional pipeline, sync or asyncio) what a waiter that
    stops waiting sends: drop its place, pop a grant that came meanwhile, and clean up. No
    transaction is needed (and none would run at maxmemory): a release pops a waiter and
    pushes its grant in one step, so once ZREM finds us gone, any grant for us is already
    there."""
    pipe.zrem(keys.queue_key, token)
    pipe.lpop(keys.grant_key(token))
    pipe.delete(keys.waiter_key(token))  # one key per DEL: cluster pipelines need that
    pipe.delete(keys.grant_key(token))
    if keys.stack is not None:  # its places in its limits' lines (lib/stack.lua)
        member = f"{keys.stack.weight}:{token}"
        for limit in keys.stack.limits:
            line = keys.stack.line_key(limit.name)
            pipe.zrem(line, member)
            pipe.hdel(line + ":alive", member)


def cancelled(replies: list[Any]) -> Grant | None:
    """The grant handed to a waiter that stopped waiting (to be checked against the key,
    ``granted_to``), from the replies to ``cancel_commands``; None when it was still queued
    (nothing was handed to it)."""
    queued, grant = replies[0], replies[1]
    if queued or grant is None:
        return None
    return parse_grant(grant)


def granted_to(handed: Grant, raw: bytes | str | None, token: str) -> Grant | None:
    """``handed`` if the key it names (read: ``raw``) is still held under ``token``; None
    when it was handed over, then lost again: nothing is ours."""
    current = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    if raw is None or current.split(":", 3)[2:3] != [token]:
        return None
    return handed


def read_commands(pipe: Any, keys: list[str]) -> Any:
    """Queue on ``pipe`` (sync or asyncio) a GET and a PTTL of each of ``keys``."""
    for key in keys:
        pipe.get(key)
        pipe.pttl(key)
    return pipe


class LockKeys:
    """The keys and constant arguments of one lock's protocol, with no client: ``name`` is
    the lock key, ``signal_key`` the waiters' wake-up list in the same hash slot, ``info``
    the holder info stored in the value; ``limit`` how many holders at once (slots) and
    ``group`` a token prefix that may hold one; ``stack`` the stacked limits a hold also
    takes a share of. Shared by the protocols of both engines."""

    def __init__(
        self,
        name: str,
        signal_key: str,
        info: str,
        *,
        limit: int = 1,
        group: str = "",
        fair_ms: int = 0,
        stack: Stack | None = None,
        unless_finished: str = "",
    ) -> None:
        self.name = name
        self.signal_key = signal_key
        self.info = info
        #: A task id: an acquire finds the key's record that its run finished instead of
        #: taking the lock ('' no such check).
        self.unless_finished = unless_finished
        #: How many holders at once (slots); ``group``: a token prefix that may hold one.
        self.limit = limit
        self.group = group
        #: ``fair_after`` in ms (0: always hand over to the first waiter).
        self.fair_ms = fair_ms
        #: The stacked limits a hold also takes a share of (``engine.stack``), if any.
        self.stack = stack
        #: Whether holds of this key may have shares to give back or renew (a stacked
        #: lock, whether or not this instance knows its stack).
        self.stacked = stack is not None or is_stacked(name)
        # The waiters' queue (see ``scripts``), in the lock's hash slot.
        base = base_key(name)  # every companion below is base + its suffix
        self.queue_key = base + QUEUE
        self.waiter_prefix = base + WAITER
        self.grant_prefix = base + GRANT
        # The slot index and its owners, and the marker a replicas' WAIT writes.
        self.slots_key = base + SLOTS
        self.owners_key = base + OWNERS
        self.sync_key = base + SYNC

    def waiter_key(self, token: str) -> str:
        """Where queued waiter ``token`` says it is still waiting (while the key lives)."""
        return self.waiter_prefix + token

    def grant_key(self, token: str) -> str:
        """The list a release pushes onto when it hands the lock to waiter ``token``."""
        return self.grant_prefix + token

    def wake_keys(self, token: str, limit: str | None) -> list[str]:
        """What a waiter blocks on: its grant list and the lock's signal list, and the
        wake-up list of the stacked ``limit`` that held it back (if any)."""
        keys = [self.grant_key(token), self.signal_key]
        if limit is not None and self.stack is not None:
            keys.append(self.stack.wake_key(limit))
        return keys


class Protocol(LockKeys, ABC):
    """How one lock talks to Redis (see :class:`LockKeys` for the arguments)."""

    def __init__(
        self,
        client: LockClient,
        name: str,
        signal_key: str,
        info: str,
        *,
        limit: int = 1,
        group: str = "",
        fair_ms: int = 0,
        stack: Stack | None = None,
        unless_finished: str = "",
    ) -> None:
        super().__init__(
            name,
            signal_key,
            info,
            limit=limit,
            group=group,
            fair_ms=fair_ms,
            stack=stack,
            unless_finished=unless_finished,
        )
        self.client = client

    @abstractmethod
    def acquire(
        self, token: str, lease_ms: int, mode: bytes, claim: str = "", poll_ms: int = 1000
    ) -> Attempt:
        """One try. ``mode``: b"x" for a non-blocking try (which asks nobody to wake it), b"0"
        for a first blocking try, b"1" for a later one. A blocking try that finds the lock
        held leaves word that this caller waits (blocking at most ``poll_ms`` between
        tries). A hold under the owner token ``claim`` (when not empty) is taken over as if
        it were ours."""

    @abstractmethod
    def release(
        self, token: str, record: tuple[str, str, int] | None = None, key: str | None = None
    ) -> int:
        """Owner-checked release of ``key`` (the lock key, or a slot): 0 not owned (nothing
        done), 1 released, 2 released and waiters signalled, 3 handed straight to a waiter.
        ``record`` = (done set, task id, keep ms): also record that task id as finished
        in the lock's done set in the same step (see ``atomic.Record``)."""

    @abstractmethod
    def extend(self, token: str, lease_ms: int, key: str | None = None) -> int:
        """Owner-checked new lease end of ``key`` (server now + ``lease_ms``): the expiry in
        server milliseconds, or 0 when not owned (nothing done)."""

    def wait(self, token: str, seconds: float, limit: str | None = None) -> Grant | None:
        """Block up to ``seconds`` until a release wakes this waiter (or, held back by the
        stacked ``limit``, a share of it is given back); the grant when the release handed
        the lock to ``token`` (it is then held), else None."""
        grant = self.grant_key(token)
        reply = call(self.name, self.client.blpop, self.wake_keys(token, limit), timeout=seconds)
        return popped_grant(reply, grant)

    def cancel(self, token: str) -> Grant | None:
        """A waiter stops waiting: drop its place; the grant if the lock was handed to it
        meanwhile (it then holds it), else None (see ``cancel_commands``)."""
        pipe = self.client.pipeline(transaction=False)
        cancel_commands(pipe, self, token)
        handed = cancelled(call(self.name, pipe.execute))
        if handed is None:
            return None
        return granted_to(handed, call(self.name, self.client.get, handed.key or self.name), token)

    def server_time(self) -> tuple[int, int]:
        """The clock of the server that holds the key, as (milliseconds, microseconds)."""
        return call(self.name, server_time, self.client, self.name)

    # -- reads (and the replicas' WAIT) that the lock's flows ask for (``core``) -----------

    def inspect(self, key: str) -> tuple[int, Any, Any]:
        """Server time (ms), the raw value of ``key`` and its PTTL (one round trip off a
        cluster, whose pipelines refuse keyless commands: the key's node clock first)."""
        if isinstance(self.client, RedisCluster):
            now_ms = self.server_time()[0]
            pipe = cast("Any", self.client).pipeline(transaction=False)  # untyped
            raw, ttl = call(self.name, read_commands(pipe, [key]).execute)
            return now_ms, raw, ttl
        pipe = self.client.pipeline(transaction=False)
        pipe.time()
        reply, raw, ttl = call(self.name, read_commands(pipe, [key]).execute)
        return time_reply(reply)[0], raw, ttl

    def slot_index(self, now_ms: int) -> Any:
        """The slots the slot index says are held after server time ``now_ms``."""
        return call(self.name, self.client.zrangebyscore, self.slots_key, f"({now_ms}", "+inf")

    def read_slots(self, keys: list[str]) -> list[Any]:
        """The raw value and PTTL of each of ``keys``, flat."""
        pipe = cast("Any", self.client).pipeline(transaction=False)  # untyped on a cluster
        return cast("list[Any]", call(self.name, read_commands(pipe, keys).execute))

    def owner_slot(self, token: str) -> Any:
        """The slot number the slot index's owners give ``token`` (raw), or None."""
        return call(self.name, self.client.hget, self.owners_key, token)

    def get(self, key: str) -> Any:
        """The raw value of ``key``."""
        return call(self.name, self.client.get, key)

    def replicate(self, replicas: int, timeout_ms: int) -> int:
        """How many replicas acknowledged every write so far (``wire.wait_for_replicas``)."""
        marker = self.sync_key
        return call(
            self.name, wait_for_replicas, self.client, self.name, marker, replicas, timeout_ms
        )
