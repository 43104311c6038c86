"""The plain-command protocol (``scripting=False``): the classic SETNX / GET / GETSET lock.

For servers where EVAL is disabled. Every nil case of the classic recipe is handled:

* SETNX fails and GET returns nil: the holder released in between; go back to SETNX.
  The same when a foreign value's TTL runs out between GET and the PTTL that reads it.
* The value read is expired: take it over with GETSET under WATCH. If the key changed
  after GET (a rival took it over, or it was deleted), EXEC aborts and nothing is written,
  so we never clobber the winner; we start over. Because of WATCH, a GETSET that does run
  returns exactly the value we read, so "GETSET returned someone else's fresh value" cannot
  happen here.

Release and extend compare the owner token under WATCH and write in MULTI/EXEC. At
``maxmemory`` Redis refuses every command queued in MULTI: release then falls back to a
checked DEL (see :meth:`PlainProtocol._release_at_maxmemory`); extend cannot rewrite the
value without a write that Redis refuses, and reports the server's state.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import redis

from celery_singleton_lock.engine.constants import FOREIGN_VALUE, WAITER_SLACK_MS
from celery_singleton_lock.engine.protocol import SIGNAL_TTL_MS, Attempt, Protocol, grace_ms
from celery_singleton_lock.engine.value import MAX_EXACT, LockValue, format_value, parse_value
from celery_singleton_lock.engine.wire import at_maxmemory, backend_error, call
from celery_singleton_lock.exceptions import LockBackendError, LockError

__all__ = ["PlainProtocol"]

#: Rounds of SETNX / GET / GETSET before reporting the lock held (the key kept changing).
ACQUIRE_ROUNDS = 8
#: What an acquire that kept losing WATCH races reports as the holder's remaining lease.
BUSY_RETRY_MS = 10
#: WATCH rounds of a release or extend before giving up with LockError.
WATCH_ROUNDS = 16
#: At maxmemory, a release deletes the key only while at least this much lease is left.
MAXMEMORY_RELEASE_MARGIN_MS = 1000


def _finished(pipe: Any, record: tuple[str, str, int], now_ms: int) -> None:
    """Queue the commands of ``lib/finished.lua`` on ``pipe``: the task id joins the done set
    at server time ``now_ms``; members older than the keep time go."""
    done, task_id, keep_ms = record
    pipe.zremrangebyscore(done, "-inf", now_ms - keep_ms)
    pipe.zadd(done, {task_id: now_ms})
    pipe.pexpire(done, keep_ms)


class PlainProtocol(Protocol):
    """Acquire, release and extend with plain commands; ``step`` is a seam between the
    steps of acquire where tests let a real rival act."""

    def step(self, where: str) -> None:
        """Called between protocol steps ("after-setnx", "after-get", "before-getset"); a
        no-op."""

    @contextlib.contextmanager
    def _watching(self) -> Iterator[Any]:
        """A transaction pipeline for WATCH whose clean-up cannot leak a raw redis-py error:
        its ``reset()`` (UNWATCH) catches only ``ConnectionError``, so on a stalled link a
        ``TimeoutError`` escaped as is. Then the connection is dropped, and the error
        surfaces as ``LockBackendError`` unless another error is already on its way."""
        pipe: Any = self.client.pipeline(transaction=True)
        finished = False
        try:
            yield pipe
            finished = True
        finally:
            try:
                pipe.reset()
            except redis.RedisError as exc:
                connection, pipe.connection, pipe.watching = pipe.connection, None, False
                if connection is not None:
                    connection.disconnect()
                    pipe.connection_pool.release(connection)
                if finished:
                    raise backend_error(exc, self.name) from exc

    def acquire(
        self, token: str, lease_ms: int, mode: bytes, claim: str = "", poll_ms: int = 1000
    ) -> Attempt:
        grace = grace_ms(lease_ms)
        ours = {token, claim} - {""}
        for _ in range(ACQUIRE_ROUNDS):
            refused: LockBackendError | None = None
            now_ms, now_us = self.server_time()
            mine = format_value(now_ms + lease_ms, True, token, now_us, self.info)
            try:
                if call(self.name, self.client.set, self.name, mine, nx=True, px=lease_ms + grace):
                    fence = self._refence(token, now_us)
                    self._leave(token, mode)
                    return Attempt(True, fence)
            except LockBackendError as exc:
                if not at_maxmemory(exc.__cause__):
                    raise
                refused = exc  # at maxmemory: still tell a contender whether it is held
            self.step("after-setnx")
            with self._watching() as pipe:
                try:
                    found = self._read(pipe)
                    if found is None:
                        if refused is not None:
                            raise refused  # free, but the server refuses our write
                        continue  # released since the SETNX: try SETNX again
                    raw, current, ttl = found
                    if current.held_at(now_ms, ttl) and current.token not in ours:
                        left = max(1, (current.expiry_ms or now_ms + (ttl or 1)) - now_ms)
                        if mode != b"x" and current.token is not None:
                            self._queue(
                                pipe,
                                raw,
                                current,
                                token,
                                now_us=now_us,
                                lease_ms=lease_ms,
                                wait_ms=min(left, poll_ms),
                            )
                        return Attempt(False, left)
                    self._may_take_over(current, refused)
                    fence = max(now_us, (current.fence or 0) + 1)
                    if current.token in ours and current.fence:
                        fence = current.fence  # our own hold, or the one we claim: keep it
                    mine = format_value(now_ms + lease_ms, True, token, fence, self.info)
                    self.step("before-getset")
                    pipe.multi()
                    pipe.getset(self.name, mine)
                    pipe.pexpire(self.name, lease_ms + grace)
                    pipe.execute()
                except redis.WatchError:
                    continue  # the key changed under us: nothing was written, start over
                except LockBackendError:
                    raise  # ours already (a RedisError too): never wrapped twice
                except redis.RedisError as exc:
                    raise backend_error(exc, self.name) from exc
            self._leave(token, mode)
            return Attempt(True, fence)
        return Attempt(False, BUSY_RETRY_MS)

    def _read(self, pipe: Any) -> tuple[bytes | str, LockValue, int | None] | None:
        """WATCH the key and read it: its raw value, parsed, and (for a foreign value, which
        is held while it has a TTL) its PTTL; None when the key is gone, including a foreign
        value whose TTL ran out between the GET and the PTTL."""
        pipe.watch(self.name)
        raw = pipe.get(self.name)
        if raw is None:
            return None
        current = parse_value(raw)
        self.step("after-get")
        ttl = pipe.pttl(self.name) if current.expiry_ms is None else None
        return None if ttl == -2 else (raw, current, ttl)

    def _may_take_over(self, current: LockValue, refused: LockBackendError | None) -> None:
        """Raise when a value that is not held must still not be taken over: a foreign one
        (never overwritten silently), one whose fencing token is at its limit, or any when
        the server refuses our write (at maxmemory)."""
        if current.expiry_ms is None:
            raise LockBackendError(FOREIGN_VALUE + self.name, self.name)
        if refused is not None:
            raise refused  # free or expired, but the server refuses our write
        if (current.fence or 0) >= MAX_EXACT:
            raise LockError("its fencing token is at its limit (2^53 - 1)", self.name)

    def _queue(
        self,
        pipe: Any,
        raw: bytes | str,
        current: LockValue,
        token: str,
        *,
        now_us: int,
        lease_ms: int,
        wait_ms: int,
    ) -> None:
        """Take a place in the waiters' queue and flag the holder's value, in one
        transaction under the WATCH on the lock key (as the scripts do; see ``scripts``).
        Best effort when the key changed meanwhile or the server is at maxmemory: the
        waiter then polls. Any other refusal (an ACL denial) is raised."""
        keep_ms = wait_ms + WAITER_SLACK_MS
        try:
            pipe.multi()
            if not current.waiters:
                data = raw.encode() if isinstance(raw, str) else raw
                pipe.setrange(self.name, data.index(b":") + 1, "1")
            pipe.zadd(self.queue_key, {token: now_us}, nx=True)
            pipe.set(self.waiter_key(token), f"{lease_ms}:{self.info}", px=keep_ms)
            pipe.pexpire(self.queue_key, keep_ms + 1000)
            pipe.delete(self.grant_key(token))  # a grant left from an earlier hold
            pipe.execute()
        except redis.WatchError:
            pass  # the key changed: this waiter polls
        except redis.RedisError as exc:
            if not at_maxmemory(exc):
                raise backend_error(exc, self.name) from exc

    def _leave(self, token: str, mode: bytes) -> None:
        """A caller that may be queued got the lock: drop its place and any grant."""
        if mode != b"1":
            return
        pipe = self.client.pipeline(transaction=False)
        pipe.zrem(self.queue_key, token)
        pipe.delete(self.waiter_key(token))  # one key per DEL: cluster pipelines need that
        pipe.delete(self.grant_key(token))
        call(self.name, pipe.execute)

    def _refence(self, token: str, provisional: int) -> int:
        """Re-issue the fencing token from the server clock *after* a plain SETNX won.

        The time read before the SETNX may predate a hold that began and ended in
        between, so it could be lower than that holder's token; a clock reading taken
        while we hold the lock is later than every earlier hold.
        """

        def rewrite(pipe: Any, current: LockValue) -> int:
            fence = max(self.server_time()[1], provisional + 1)
            value = format_value(current.expiry_ms or 0, True, token, fence, current.info)
            pipe.multi()
            pipe.set(self.name, value, keepttl=True)
            pipe.execute()
            return fence

        # Not owned any more is only possible past the lease: keep the provisional token.
        return self._while_owned(token, rewrite, provisional, "issuing its fencing token")

    def release(
        self, token: str, record: tuple[str, str, int] | None = None, key: str | None = None
    ) -> int:
        def delete(pipe: Any, current: LockValue) -> int:
            now_ms = self.server_time()[0] if record is not None else 0
            pipe.multi()
            pipe.delete(self.name)
            if record is not None:
                _finished(pipe, record, now_ms)
            pipe.rpush(self.signal_key, "1")
            pipe.pexpire(self.signal_key, SIGNAL_TTL_MS)
            pipe.execute()
            return 2

        try:
            return self._while_owned(token, delete, 0, "release")
        except LockBackendError as exc:
            if not at_maxmemory(exc.__cause__):
                raise
            released = self._release_at_maxmemory(token, exc)
            if released and record is not None:
                pipe = self.client.pipeline(transaction=False)
                _finished(pipe, record, self.server_time()[0])
                call(self.name, pipe.execute)
            return released

    def _release_at_maxmemory(self, token: str, error: LockBackendError) -> int:
        """Release when Redis is at maxmemory and refuses MULTI: read the server clock and
        the value, and DEL (a write that needs no memory) only while our lease has
        ``MAXMEMORY_RELEASE_MARGIN_MS`` left. Until our lease ends nobody else can take the
        key, and at maxmemory nobody can write it at all (SET is refused), so the DEL removes
        our own hold unless this client stalls longer than the margin between the reads and
        the DEL. Waiters are not signalled (that push is refused too): they poll."""
        now_ms = self.server_time()[0]
        raw = call(self.name, self.client.get, self.name)
        current = parse_value(raw) if raw is not None else None
        if current is None or current.token != token:
            return 0
        if current.expiry_ms is None or current.expiry_ms - now_ms < MAXMEMORY_RELEASE_MARGIN_MS:
            raise LockBackendError(
                "Redis is at maxmemory and the lease ends within a second: left to expire",
                self.name,
            ) from error.__cause__
        call(self.name, self.client.delete, self.name)
        return 1

    def extend(self, token: str, lease_ms: int, key: str | None = None) -> int:
        def rewrite(pipe: Any, current: LockValue) -> int:
            expiry = self.server_time()[0] + lease_ms
            value = format_value(expiry, True, token, current.fence or 0, current.info)
            pipe.multi()
            pipe.set(self.name, value, px=lease_ms + grace_ms(lease_ms))
            pipe.execute()
            return expiry

        return self._while_owned(token, rewrite, 0, "extend")

    def _while_owned(
        self, token: str, write: Callable[[Any, LockValue], int], not_owned: int, what: str
    ) -> int:
        """Run ``write(pipe, current value)`` under WATCH while ``token`` owns the key,
        starting over when the key changes first (e.g. our own renewer extended it);
        ``not_owned`` when the key is gone or someone else's."""
        for _ in range(WATCH_ROUNDS):
            with self._watching() as pipe:
                try:
                    pipe.watch(self.name)
                    raw = pipe.get(self.name)
                    current = parse_value(raw) if raw is not None else None
                    if current is None or current.token != token:
                        return not_owned
                    return write(pipe, current)
                except redis.WatchError:
                    continue
                except LockBackendError:
                    raise  # ours already (a RedisError too): never wrapped twice
                except redis.RedisError as exc:
                    raise backend_error(exc, self.name) from exc
        raise LockError(f"the lock key kept changing during {what}", self.name)
