"""``RedisLock``: the SETNX/GETSET expiry-timestamp lock, made safe.

The key's value says until when the lock is held (Redis server milliseconds), who holds
it (a random owner token) and with which fencing token. Acquire is SETNX, else take over
an expired value; release and extend act only for the owner. By default each of those is
one Lua script (one round trip); ``scripting=False`` runs the classic plain-command protocol
(SETNX / GET / GETSET under WATCH) for servers where EVAL is disabled.

Waiters block on a per-lock signal list (BLPOP) that a release pushes to, so a hand-off
takes one round trip instead of a sleep; the BLPOP timeout doubles as the fallback poll
that notices a crashed holder's lease running out. This module imports nothing from Celery.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import socket
import time
import uuid
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

import redis
from redis.cluster import RedisCluster

from celery_singleton_lock import _scripts
from celery_singleton_lock._renewer import renewer
from celery_singleton_lock._value import Holder, LockValue, format_value, parse_value
from celery_singleton_lock.exceptions import LockBackendError, LockError, LockNotOwned

__all__ = ["RedisLock", "companion_key"]

log = logging.getLogger("celery_singleton_lock.lock")

_T = TypeVar("_T")
_SIGNAL_TTL_MS = 2000
_MIN_WAIT = 0.001
# How late Redis may time out a BLPOP: it checks on its timer tick (hz 10 = every 0.1 s).
_TIMER_SLACK = 0.11


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


class _Script:
    """One protocol script: EVALSHA with pre-encoded arguments, loaded on NOSCRIPT.

    Calling ``execute_command`` directly (rather than redis-py's ``Script`` wrapper) keeps
    the hot path to one packing of already-encoded bytes.
    """

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()  # noqa: S324 - Redis names scripts by SHA1

    def __call__(self, client: Any, numkeys: int, *args: bytes | int | str) -> Any:
        try:
            return client.execute_command("EVALSHA", self.sha, numkeys, *args)
        except redis.exceptions.NoScriptError:
            client.script_load(self.source)  # a restarted or failed-over server
            return client.execute_command("EVALSHA", self.sha, numkeys, *args)


_ACQUIRE = _Script(_scripts.ACQUIRE)
_RELEASE = _Script(_scripts.RELEASE)
_EXTEND = _Script(_scripts.EXTEND)


class RedisLock:
    """A lease-based distributed lock on one Redis key.

    ``timeout`` is the lease in seconds. ``auto_renew`` keeps extending the lease while the
    lock is held (see ``lease_lost``). ``fallback_poll`` bounds how long a waiter sleeps
    without news before it looks again. ``token`` fixes the owner token (several instances
    sharing a token are one owner); ``holder_info`` is a short text (or JSON-able mapping)
    stored with the lock for operators.
    """

    def __init__(
        self,
        client: Any,
        name: str,
        timeout: float = 30.0,
        *,
        auto_renew: bool = False,
        scripting: bool = True,
        fallback_poll: float = 1.0,
        token: str | None = None,
        holder_info: str | dict[str, Any] | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"lock name must be a non-empty string, got {name!r}")
        self._lease_ms = _lease_ms(timeout, "timeout")
        _lease_ms(fallback_poll, "fallback_poll")
        if token is not None and (not token or ":" in token):
            raise ValueError(f"token must be a non-empty string without ':', got {token!r}")
        self.client = client
        self.name = name
        self.timeout = float(timeout)
        self.auto_renew = auto_renew
        self.scripting = scripting
        self.fallback_poll = float(fallback_poll)
        self.token = token or uuid.uuid4().hex
        self.signal_key = companion_key(name, "signal")
        if holder_info is None:
            holder_info = {"host": socket.gethostname(), "pid": os.getpid()}
        self.holder_info = (
            holder_info if isinstance(holder_info, str) else json.dumps(holder_info, sort_keys=True)
        )
        self.fencing_token: int | None = None
        #: Set when auto-renewal found the lock gone or could not reach Redis in time.
        self.lease_lost = False
        self._expires_at = 0.0  # local monotonic estimate of the lease end, for the renewer
        self._generation = 0
        self._handed_off = False
        # Arguments that never change for this lock, encoded once for the scripts.
        self._name_b = name.encode()
        self._token_b = self.token.encode()
        self._info_b = self.holder_info.encode()
        self._signal_b = self.signal_key.encode()
        # On Redis Cluster, TIME must go to the node that owns the lock's slot.
        self._cluster = isinstance(client, RedisCluster)

    def __repr__(self) -> str:
        return f"<RedisLock {self.name!r} token={self.token[:8]}… fence={self.fencing_token}>"

    # -- public API ---------------------------------------------------------------------

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Take the lock; wait up to ``timeout`` seconds (None: forever) when ``blocking``.

        Returns False only when the lock stayed held; Redis errors raise LockBackendError.
        """
        if timeout is not None and (isinstance(timeout, bool) or timeout < 0):
            raise ValueError(f"acquire timeout must be >= 0 or None, got {timeout!r}")
        deadline = None if timeout is None else time.monotonic() + timeout
        waited = False
        if blocking and self._handed_off:
            # Our last release woke a waiter: queue behind it instead of barging in.
            waited = True
            self._wait(self.fallback_poll, deadline)
        self._handed_off = False
        while True:
            started = time.monotonic()
            held_for_ms = self._attempt(b"1" if waited else b"0" if blocking else b"x")
            if held_for_ms is None:
                self._on_acquired(started)
                return True
            if not blocking:
                return False
            if deadline is not None and time.monotonic() >= deadline:
                return False
            # Sleep until the holder's lease ends (its crash is noticed then), a release
            # wakes us, or the fallback period passes, whichever comes first.
            self._wait(min(held_for_ms / 1000 + _MIN_WAIT, self.fallback_poll), deadline)
            waited = True

    def release(self) -> None:
        """Release the lock; LockNotOwned if this instance no longer holds it."""
        self._stop_renewing()
        self.fencing_token = None
        if self.scripting:
            result = self._call(
                _RELEASE, self.client, 2, self._name_b, self._signal_b, self._token_b,
                _SIGNAL_TTL_MS,
            )  # fmt: skip
        else:
            result = self._release_plain()
        if not result:
            raise LockNotOwned("cannot release a lock that is no longer owned", self.name)
        self._handed_off = result == 2

    def extend(self, timeout: float | None = None) -> None:
        """Set the lease end to server now + ``timeout`` (default: the lease); owner only."""
        lease_ms = self._lease_ms if timeout is None else _lease_ms(timeout, "timeout")
        started = time.monotonic()
        if self.scripting:
            expiry = self._call(
                _EXTEND, self.client, 1, self._name_b, self._token_b, lease_ms,
                self._grace_ms(lease_ms),
            )  # fmt: skip
        else:
            expiry = self._extend_plain(lease_ms)
        if not expiry:
            raise LockNotOwned("cannot extend a lock that is no longer owned", self.name)
        self._expires_at = started + lease_ms / 1000

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

    # -- acquire --------------------------------------------------------------------------

    def _grace_ms(self, lease_ms: int) -> int:
        """How long the key outlives its lease, so abandoned keys vanish on their own."""
        return 1000 + lease_ms // 10

    def _attempt(self, mode: bytes) -> int | None:
        """One try: None when acquired, else ms until the current holder's lease ends.

        ``mode``: b"1" after waiting, b"0" for a first blocking try, b"x" for a
        non-blocking try (which asks nobody to wake it).
        """
        if not self.scripting:
            return self._attempt_plain()
        result = self._call(
            _ACQUIRE, self.client, 1, self._name_b, self._token_b, self._lease_ms,
            self._grace_ms(self._lease_ms), mode, self._info_b,
        )  # fmt: skip
        if int(result[0]) == 1:
            self.fencing_token = int(result[1])
            return None
        return max(1, int(result[1]))

    def _attempt_plain(self) -> int | None:
        """The classic protocol with plain commands; every nil case handled."""
        grace = self._grace_ms(self._lease_ms)
        for _ in range(8):
            now_ms, now_us = self._server_time()
            mine = format_value(now_ms + self._lease_ms, True, self.token, now_us, self.holder_info)
            if self._call(self.client.set, self.name, mine, nx=True, px=self._lease_ms + grace):
                self.fencing_token = self._refence(now_us)
                return None
            self._step("after-setnx")
            with self.client.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(self.name)
                    raw = pipe.get(self.name)
                    if raw is None:
                        continue  # released between SETNX and GET: try SETNX again
                    current = parse_value(raw)
                    ttl = pipe.pttl(self.name) if current.expiry_ms is None else None
                    if current.held_at(now_ms, ttl) and current.token != self.token:
                        return max(1, (current.expiry_ms or now_ms + (ttl or 1)) - now_ms)
                    fence = max(now_us, (current.fence or 0) + 1)
                    if current.token == self.token and current.fence:
                        fence = current.fence  # our own hold (e.g. a retried call): keep it
                    mine = format_value(
                        now_ms + self._lease_ms, True, self.token, fence, self.holder_info
                    )
                    self._step("before-getset")
                    pipe.multi()
                    pipe.getset(self.name, mine)
                    pipe.pexpire(self.name, self._lease_ms + grace)
                    old = pipe.execute()[0]
                except redis.WatchError:
                    continue  # the key changed under us: nothing was written, start over
                except redis.RedisError as exc:
                    raise LockBackendError(f"Redis error: {exc}", self.name) from exc
            if getset_won(old, raw, now_ms):
                self.fencing_token = fence
                return None
            # Unreachable under WATCH, kept as the protocol demands: put the winner back.
            self._restore(mine, old)
            return max(1, (parse_value(old).expiry_ms or now_ms + 1) - now_ms)
        return 10  # the key kept changing under us: report it held and let the caller wait

    def _refence(self, provisional: int) -> int:
        """Re-issue the fencing token from the server clock *after* a plain SETNX won.

        The time read before the SETNX may predate a hold that began and ended in
        between, so it could be lower than that holder's token; a clock reading taken
        while we hold the lock is later than every earlier hold.
        """

        def rewrite(pipe: Any, current: LockValue) -> int:
            fence = max(self._server_time()[1], provisional + 1)
            value = format_value(current.expiry_ms or 0, True, self.token, fence, current.info)
            pipe.multi()
            pipe.set(self.name, value, keepttl=True)
            pipe.execute()
            return fence

        # Not owned any more is only possible past the lease: keep the provisional token.
        return self._while_owned(rewrite, provisional, "issuing its fencing token")

    def _restore(self, mine: str, theirs: bytes) -> None:
        """Undo a GETSET that overwrote a live holder's value, if nobody wrote since."""
        with self.client.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(self.name)
                if pipe.get(self.name) == mine.encode():
                    pipe.multi()
                    pipe.set(self.name, theirs, keepttl=True)
                    pipe.execute()
            except redis.WatchError:
                pass

    def _step(self, where: str) -> None:
        """A seam between protocol steps of the plain mode; tests interleave rivals here."""

    def _on_acquired(self, started: float) -> None:
        self._generation += 1
        self.lease_lost = False
        self._expires_at = started + self._lease_ms / 1000
        if self.auto_renew:
            renewer.schedule(self, self.timeout / 3, self._generation)

    # -- waiting --------------------------------------------------------------------------

    def _wait(self, seconds: float, deadline: float | None) -> None:
        """Block on the signal list for at most ``seconds`` (and never past ``deadline``)."""
        if deadline is not None:
            seconds = min(seconds, deadline - time.monotonic())
        cap = self._socket_timeout()
        if cap is not None:
            seconds = min(seconds, cap * 0.8)
        if seconds > _TIMER_SLACK + 0.04:
            # The server checks BLPOP timeouts only on its timer tick, up to ~0.1 s late:
            # ask for less and wake early rather than late.
            self._call(
                self.client.blpop, [self.signal_key], timeout=round(seconds - _TIMER_SLACK, 3)
            )
        elif seconds > 0:
            time.sleep(seconds)  # the last stretch before a lease ends, timed here exactly

    def _socket_timeout(self) -> float | None:
        if self._cluster:  # RedisCluster keeps the node connection options itself
            kwargs = self.client.get_connection_kwargs() or {}
        else:
            pool = getattr(self.client, "connection_pool", None)
            kwargs = getattr(pool, "connection_kwargs", {}) or {}
        value = kwargs.get("socket_timeout")
        return float(value) if value else None

    # -- release / extend without scripts ---------------------------------------------------

    def _release_plain(self) -> int:
        """Owner-checked DEL plus a wake-up, under WATCH/MULTI."""

        def delete(pipe: Any, current: LockValue) -> int:
            pipe.multi()
            pipe.delete(self.name)
            pipe.rpush(self.signal_key, "1")
            pipe.pexpire(self.signal_key, _SIGNAL_TTL_MS)
            pipe.execute()
            return 1

        return self._while_owned(delete, 0, "release")

    def _extend_plain(self, lease_ms: int) -> int:
        """Owner-checked rewrite of the expiry, under WATCH/MULTI."""

        def rewrite(pipe: Any, current: LockValue) -> int:
            expiry = self._server_time()[0] + lease_ms
            value = format_value(expiry, True, self.token, current.fence or 0, current.info)
            pipe.multi()
            pipe.set(self.name, value, px=lease_ms + self._grace_ms(lease_ms))
            pipe.execute()
            return expiry

        return self._while_owned(rewrite, 0, "extend")

    def _while_owned(
        self, write: Callable[[Any, LockValue], int], not_owned: int, what: str
    ) -> int:
        """Run ``write(pipe, current value)`` under WATCH while this instance owns the key,
        starting over when the key changes first (e.g. our own renewer extended it);
        ``not_owned`` when the key is gone or someone else's."""
        for _ in range(16):
            with self.client.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(self.name)
                    raw = pipe.get(self.name)
                    current = parse_value(raw) if raw is not None else None
                    if current is None or current.token != self.token:
                        return not_owned
                    return write(pipe, current)
                except redis.WatchError:
                    continue
                except redis.RedisError as exc:
                    raise LockBackendError(f"Redis error: {exc}", self.name) from exc
        raise LockError(f"the lock key kept changing during {what}", self.name)

    # -- renewal (called by the process-wide renewer thread) -------------------------------

    def _renew_due(self, generation: int) -> float | None:
        if generation != self._generation or not self.auto_renew:
            return None
        try:
            self.extend()
        except LockNotOwned:
            self.lease_lost = True
            log.error("lock %r: lease lost (another holder took it or it expired)", self.name)
            return None
        except LockError as exc:
            left = self._expires_at - time.monotonic()
            if left <= 0:
                self.lease_lost = True
                log.error("lock %r: lease lost, Redis unreachable: %s", self.name, exc)
                return None
            log.warning("lock %r: renewal failed, retrying: %s", self.name, exc)
            return min(max(left / 4, 0.05), self.timeout / 3)
        return self.timeout / 3

    def _renewing(self, generation: int) -> bool:
        return generation == self._generation and self.auto_renew

    def _stop_renewing(self) -> None:
        self._generation += 1

    # -- helpers -----------------------------------------------------------------------------

    def _server_time(self) -> tuple[int, int]:
        """Redis server time as (milliseconds, microseconds), from the node holding the key."""
        if self._cluster:  # RedisCluster sends TIME to a default node, not the key's
            node = self.client.get_node_from_key(self.name)
            seconds, micros = self._call(self.client.time, target_nodes=node)
        else:
            seconds, micros = self._call(self.client.time)
        return int(seconds) * 1000 + int(micros) // 1000, int(seconds) * 1_000_000 + int(micros)

    def _inspect(self) -> tuple[int, LockValue | None, int | None]:
        """Server time, the parsed value and the key's PTTL (one round trip off a cluster)."""
        if self._cluster:
            # Cluster pipelines refuse keyless commands: read the key's node clock first.
            now_ms = self._server_time()[0]
            pipe = self.client.pipeline(transaction=False)
            pipe.get(self.name)
            pipe.pttl(self.name)
            raw, ttl = self._call(pipe.execute)
        else:
            pipe = self.client.pipeline(transaction=False)
            pipe.time()
            pipe.get(self.name)
            pipe.pttl(self.name)
            (seconds, micros), raw, ttl = self._call(pipe.execute)
            now_ms = int(seconds) * 1000 + int(micros) // 1000
        return now_ms, (parse_value(raw) if raw is not None else None), int(ttl)

    def _call(self, func: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """Run one Redis call, turning redis-py errors into LockBackendError."""
        try:
            return func(*args, **kwargs)
        except (redis.RedisError, redis.exceptions.RedisClusterException) as exc:
            raise LockBackendError(f"Redis error: {exc}", self.name) from exc


def getset_won(old: bytes | None, watched: bytes, now_ms: int) -> bool:
    """Whether a GETSET that returned ``old`` took the lock.

    nil: the key vanished in between, so the lock is ours; the stale value we watched, or
    any value whose lease had ended: ours; a live foreign value: we lost.
    """
    if old is None or old == watched:
        return True
    return not parse_value(old).held_at(now_ms, None)
