"""The plain-command protocol (``scripting=False``): the classic SETNX / GET / GETSET lock.

For servers where EVAL is disabled. Every nil case of the classic recipe is handled:

* SETNX fails and GET returns nil: the holder released in between; go back to SETNX.
* The value read is expired: take it over with GETSET under WATCH. If the key changed
  after GET (a rival took it over, or it was deleted), EXEC aborts and nothing is written,
  so we never clobber the winner; we start over. Because of WATCH, a GETSET that does run
  returns exactly the value we read, so "GETSET returned someone else's fresh value" cannot
  happen here.

Release and extend compare the owner token under WATCH and write in MULTI/EXEC.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis

from celery_singleton_lock._protocol import SIGNAL_TTL_MS, Attempt, Protocol, grace_ms
from celery_singleton_lock._redis import call
from celery_singleton_lock._value import MAX_EXACT, LockValue, format_value, parse_value
from celery_singleton_lock.exceptions import LockBackendError, LockError

__all__ = ["PlainProtocol"]

#: Rounds of SETNX / GET / GETSET before reporting the lock held (the key kept changing).
ACQUIRE_ROUNDS = 8
#: What an acquire that kept losing WATCH races reports as the holder's remaining lease.
BUSY_RETRY_MS = 10
#: WATCH rounds of a release or extend before giving up with LockError.
WATCH_ROUNDS = 16


class PlainProtocol(Protocol):
    """Acquire, release and extend with plain commands; ``step`` is a seam between the
    steps of acquire where tests let a real rival act."""

    def step(self, where: str) -> None:
        """Called between protocol steps ("after-setnx", "before-getset"); a no-op."""

    def acquire(self, token: str, lease_ms: int, mode: bytes, claim: str = "") -> Attempt:
        grace = grace_ms(lease_ms)
        ours = {token, claim} - {""}
        for _ in range(ACQUIRE_ROUNDS):
            now_ms, now_us = self.server_time()
            mine = format_value(now_ms + lease_ms, True, token, now_us, self.info)
            if call(self.name, self.client.set, self.name, mine, nx=True, px=lease_ms + grace):
                return Attempt(True, self._refence(token, now_us))
            self.step("after-setnx")
            with self.client.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(self.name)
                    raw = pipe.get(self.name)
                    if raw is None:
                        continue  # released between SETNX and GET: try SETNX again
                    current = parse_value(raw)
                    ttl = pipe.pttl(self.name) if current.expiry_ms is None else None
                    if current.held_at(now_ms, ttl) and current.token not in ours:
                        return Attempt(
                            False, max(1, (current.expiry_ms or now_ms + (ttl or 1)) - now_ms)
                        )
                    if (current.fence or 0) >= MAX_EXACT:
                        raise LockError("its fencing token is at its limit (2^53 - 1)", self.name)
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
                except redis.RedisError as exc:
                    raise LockBackendError(f"Redis error: {exc}", self.name) from exc
            return Attempt(True, fence)
        return Attempt(False, BUSY_RETRY_MS)

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

    def release(self, token: str) -> int:
        def delete(pipe: Any, current: LockValue) -> int:
            pipe.multi()
            pipe.delete(self.name)
            pipe.rpush(self.signal_key, "1")
            pipe.pexpire(self.signal_key, SIGNAL_TTL_MS)
            pipe.execute()
            return 1

        return self._while_owned(token, delete, 0, "release")

    def extend(self, token: str, lease_ms: int) -> int:
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
            with self.client.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(self.name)
                    raw = pipe.get(self.name)
                    current = parse_value(raw) if raw is not None else None
                    if current is None or current.token != token:
                        return not_owned
                    return write(pipe, current)
                except redis.WatchError:
                    continue
                except redis.RedisError as exc:
                    raise LockBackendError(f"Redis error: {exc}", self.name) from exc
        raise LockError(f"the lock key kept changing during {what}", self.name)
