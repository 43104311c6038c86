"""``RedisLock``: the SETNX/GETSET expiry-timestamp lock, made safe.

The key's value says until when the lock is held (Redis server milliseconds), who holds
it (a random owner token) and with which fencing token. Acquire is SETNX, else take over
an expired value; release and extend act only for the owner. How each step reaches Redis is
a :class:`~celery_singleton_lock._protocol.Protocol`: Lua scripts by default, the classic
plain commands with ``scripting=False``.

Waiters block on a per-lock signal list (BLPOP) that a release pushes to, so a hand-off
takes one round trip instead of a sleep; the BLPOP timeout doubles as the fallback poll
that notices a crashed holder's lease running out. This module imports nothing from Celery.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import time
import uuid
from types import TracebackType
from typing import Any, ClassVar, cast

import redis
from redis.cluster import RedisCluster

from celery_singleton_lock._plain import PlainProtocol
from celery_singleton_lock._protocol import Protocol
from celery_singleton_lock._redis import LockClient, call, socket_timeout, time_reply
from celery_singleton_lock._renewer import renewer
from celery_singleton_lock._scripted import ScriptedProtocol
from celery_singleton_lock._value import Holder, LockValue, parse_value
from celery_singleton_lock.exceptions import LockBackendError, LockError, LockNotOwned

__all__ = ["Holder", "RedisLock", "companion_key"]

log = logging.getLogger("celery_singleton_lock.lock")

#: Added to a holder's remaining lease before trying again, so we arrive just after it ends.
_MIN_WAIT = 0.001
#: How late Redis may time out a BLPOP: it checks on its timer tick (hz 10 = every 0.1 s).
_TIMER_SLACK = 0.11
#: Waits shorter than the slack plus this are slept in the client instead of in BLPOP.
_BLPOP_MARGIN = 0.04
#: A BLPOP must return before the client's socket timeout: use at most this share of it.
_SOCKET_SHARE = 0.8
#: Renew every lease / this; retry a failed renewal after a quarter of what is left.
_RENEW_DIVISOR = 3
_MIN_RENEW_RETRY = 0.05


def companion_key(name: str, suffix: str) -> str:
    """A key that lives in the same Redis Cluster hash slot as ``name``.

    When ``name`` has a hash tag (``{...}``) the suffix is simply appended; otherwise the
    whole name becomes the tag. A name with a ``}`` but no valid tag cannot be co-located.
    """
    start = name.find("{")
    if start != -1:
        end = name.find("}", start + 1)
        if end > start + 1:
            return f"{name}:{suffix}"
    if "}" in name:
        raise ValueError(
            f"lock name {name!r} contains '}}' without a hash tag; wrap the part that "
            "identifies the lock in braces, e.g. 'orders:{sku-42}'"
        )
    return f"{{{name}}}:{suffix}"


def _lease_ms(value: object, what: str) -> int:
    """Validate a lease in seconds and return it in milliseconds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be a positive number of seconds, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what} must be a positive number of seconds, got {value!r}")
    return max(1, round(value * 1000))


class RedisLock:
    """A lease-based distributed lock on one Redis key.

    ``timeout`` is the lease in seconds. ``auto_renew`` keeps extending the lease while the
    lock is held (see ``lease_lost``). ``fallback_poll`` bounds how long a waiter sleeps
    without news before it looks again. ``token`` fixes the owner token (several instances
    sharing a token are one owner); ``claim`` names another owner token whose hold this
    lock's acquire takes over atomically, fencing token included (how the run of a queued
    task takes the lock its message held); ``holder_info`` is a short text (or JSON-able
    mapping) stored with the lock for operators.
    """

    #: The protocol for each value of ``scripting``; tests substitute instrumented ones.
    protocols: ClassVar[dict[bool, type[Protocol]]] = {
        True: ScriptedProtocol,
        False: PlainProtocol,
    }

    def __init__(
        self,
        client: LockClient,
        name: str,
        timeout: float = 30.0,
        *,
        auto_renew: bool = False,
        scripting: bool = True,
        fallback_poll: float = 1.0,
        token: str | None = None,
        claim: str | None = None,
        holder_info: str | dict[str, Any] | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"lock name must be a non-empty string, got {name!r}")
        self._lease_ms = _lease_ms(timeout, "timeout")
        _lease_ms(fallback_poll, "fallback_poll")
        for label, given in (("token", token), ("claim", claim)):
            if given is not None and (not given or ":" in given):
                raise ValueError(f"{label} must be a non-empty string without ':', got {given!r}")
        self.client = client
        self.name = name
        self.timeout = float(timeout)
        self.auto_renew = auto_renew
        self.scripting = scripting
        self.fallback_poll = float(fallback_poll)
        self.token = token or uuid.uuid4().hex
        self.claim = claim or ""
        self.signal_key = companion_key(name, "signal")
        if holder_info is None:
            holder_info = {"host": socket.gethostname(), "pid": os.getpid()}
        self.holder_info = (
            holder_info if isinstance(holder_info, str) else json.dumps(holder_info, sort_keys=True)
        )
        self.protocol = self.protocols[scripting](client, name, self.signal_key, self.holder_info)
        self.fencing_token: int | None = None
        self._lost = False
        self._expires_at = 0.0  # local monotonic estimate of the lease end (a lower bound)
        self._generation = 0
        self._handed_off = False

    def __repr__(self) -> str:
        return f"<RedisLock {self.name!r} token={self.token[:8]}… fence={self.fencing_token}>"

    # -- public API ---------------------------------------------------------------------

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Take the lock; wait up to ``timeout`` seconds (None: forever) when ``blocking``.

        Returns False only when the lock stayed held; Redis errors raise LockBackendError.
        """
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, (int, float))
            or math.isnan(timeout)
            or timeout < 0
        ):
            raise ValueError(f"acquire timeout must be a number >= 0 or None, got {timeout!r}")
        if timeout is not None and math.isinf(timeout):
            timeout = None  # math.inf: wait forever
        deadline = None if timeout is None else time.monotonic() + timeout
        waited = False
        if blocking and self._handed_off:
            # Our last release woke a waiter: queue behind it instead of barging in.
            waited = True
            self._wait(self.fallback_poll, deadline)
        self._handed_off = False
        while True:
            started = time.monotonic()
            mode = b"1" if waited else b"0" if blocking else b"x"
            try:
                acquired, number = self.protocol.acquire(
                    self.token, self._lease_ms, mode, self.claim
                )
            except LockBackendError as exc:
                number = self._held_after_lost_reply(exc)
                acquired = True
            if acquired:
                self.fencing_token = number
                self._on_acquired(started)
                return True
            if not blocking:
                return False
            if deadline is not None and time.monotonic() >= deadline:
                return False
            # Sleep until the holder's lease ends (its crash is noticed then), a release
            # wakes us, or the fallback period passes, whichever comes first.
            self._wait(min(max(1, number) / 1000 + _MIN_WAIT, self.fallback_poll), deadline)
            waited = True

    def release(self) -> None:
        """Release the lock; LockNotOwned if this instance no longer holds it."""
        self._stop_renewing()
        self.fencing_token = None
        result = self.protocol.release(self.token)
        if not result:
            raise LockNotOwned("cannot release a lock that is no longer owned", self.name)
        self._handed_off = result == 2

    def extend(self, timeout: float | None = None) -> None:
        """Set the lease end to server now + ``timeout`` (default: the lease); owner only."""
        lease_ms = self._lease_ms if timeout is None else _lease_ms(timeout, "timeout")
        started, generation = time.monotonic(), self._generation
        if not self.protocol.extend(self.token, lease_ms):
            raise LockNotOwned("cannot extend a lock that is no longer owned", self.name)
        if generation == self._generation:  # else the reply is about an earlier hold
            self._expires_at = started + lease_ms / 1000

    @property
    def lease_lost(self) -> bool:
        """True once the current hold can no longer be trusted: renewal found the lock gone,
        or the lease's deadline passed with no confirmed renewal. Judged by the local clock
        from the last confirmed lease, so a stalled connection cannot delay it."""
        if self._lost:
            return True
        return self.fencing_token is not None and time.monotonic() >= self._expires_at

    @lease_lost.setter
    def lease_lost(self, value: bool) -> None:
        self._lost = value

    def owned(self) -> bool:
        """Whether this instance holds the lock right now, per the server's clock."""
        now_ms, value, _ = self._inspect()
        return value is not None and value.token == self.token and value.held_at(now_ms)

    def locked(self) -> bool:
        """Whether anyone holds the lock right now, per the server's clock."""
        now_ms, value, ttl = self._inspect()
        return value is not None and value.held_at(now_ms, ttl)

    def holder(self) -> Holder | None:
        """Who holds the lock now (token, fencing token, lease left, holder info), or None."""
        now_ms, value, ttl = self._inspect()
        return value.holder(now_ms, ttl) if value is not None else None

    def detach(self) -> None:
        """Stop renewing and forget the hold locally, without releasing it: the lock stays
        with whoever has this owner token (e.g. a queued task message) until it expires."""
        self._stop_renewing()
        self.fencing_token = None

    def __enter__(self) -> RedisLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.release()
        except LockNotOwned:
            if exc is None:
                raise
            log.warning("lock %r was lost before the block that held it failed", self.name)

    # -- internals ------------------------------------------------------------------------

    def _held_after_lost_reply(self, error: LockBackendError) -> int:
        """After an acquire whose reply was lost (a connection error mid-call), look once,
        by token, whether the write happened: return the hold's fencing token if it did,
        so the caller owns what the server granted; re-raise ``error`` if it did not (or
        the server cannot say), leaving nothing held in our name that we do not know of
        but for a lease the server will end."""
        if not isinstance(error.__cause__, (redis.ConnectionError, redis.TimeoutError)):
            raise error
        try:
            now_ms, value, _ = self._inspect()
        except LockBackendError:
            raise error from None
        if value is None or value.token != self.token or not value.held_at(now_ms):
            raise error
        log.warning("lock %r: acquire reply lost, but the server granted it", self.name)
        return value.fence or 0

    def _on_acquired(self, started: float) -> None:
        self._generation += 1
        self.lease_lost = False
        self._expires_at = started + self._lease_ms / 1000
        if self.auto_renew:
            renewer.schedule(self, self.timeout / _RENEW_DIVISOR, self._generation)

    def _wait(self, seconds: float, deadline: float | None) -> None:
        """Block on the signal list for at most ``seconds`` (and never past ``deadline``)."""
        if deadline is not None:
            seconds = min(seconds, deadline - time.monotonic())
        cap = socket_timeout(self.client)
        if cap is not None:
            seconds = min(seconds, cap * _SOCKET_SHARE)
        if seconds > _TIMER_SLACK + _BLPOP_MARGIN:
            # The server checks BLPOP timeouts only on its timer tick, up to ~0.1 s late:
            # ask for less and wake early rather than late.
            call(
                self.name,
                self.client.blpop,
                [self.signal_key],
                timeout=round(seconds - _TIMER_SLACK, 3),
            )
        elif seconds > 0:
            time.sleep(seconds)  # the last stretch before a lease ends, timed here exactly

    def _inspect(self) -> tuple[int, LockValue | None, int | None]:
        """Server time, the parsed value and the key's PTTL (one round trip off a cluster)."""
        if isinstance(self.client, RedisCluster):
            # Cluster pipelines refuse keyless commands: read the key's node clock first.
            now_ms = self.protocol.server_time()[0]
            cluster_pipe = cast("Any", self.client).pipeline(transaction=False)  # untyped
            cluster_pipe.get(self.name)
            cluster_pipe.pttl(self.name)
            raw, ttl = call(self.name, cluster_pipe.execute)
        else:
            pipe = self.client.pipeline(transaction=False)
            pipe.time()
            pipe.get(self.name)
            pipe.pttl(self.name)
            reply, raw, ttl = call(self.name, pipe.execute)
            now_ms = time_reply(reply)[0]
        return now_ms, (parse_value(raw) if raw is not None else None), int(ttl)

    # -- renewal (called by the process-wide renewer thread) -------------------------------

    def _renew_due(self, generation: int) -> float | None:
        if generation != self._generation or not self.auto_renew:
            return None
        try:
            self.extend()
        except LockNotOwned:
            if generation != self._generation:
                return None  # a reply about an earlier hold: the current one is not lost
            self.lease_lost = True
            log.error("lock %r: lease lost (another holder took it or it expired)", self.name)
            return None
        except LockError as exc:
            if generation != self._generation:
                return None
            left = self._expires_at - time.monotonic()
            if left <= 0:
                self.lease_lost = True
                log.error("lock %r: lease lost, Redis unreachable: %s", self.name, exc)
                return None
            log.warning("lock %r: renewal failed, retrying: %s", self.name, exc)
            return min(max(left / 4, _MIN_RENEW_RETRY), self.timeout / _RENEW_DIVISOR)
        return self.timeout / _RENEW_DIVISOR

    def _renewing(self, generation: int) -> bool:
        return generation == self._generation and self.auto_renew

    def _stop_renewing(self) -> None:
        self._generation += 1
