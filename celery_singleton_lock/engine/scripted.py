"""The scripted protocol: each lock operation is one EVALSHA of a registered script
(:data:`.scripts.SCRIPTS`), and a release hands the lock straight to the first waiter in
line (see :mod:`.scripts`)."""

from __future__ import annotations

from typing import Any, NamedTuple, cast

import redis

from celery_singleton_lock.engine.protocol import Attempt, LockKeys, Protocol
from celery_singleton_lock.engine.scripts import SCRIPTS, Script
from celery_singleton_lock.engine.wire import backend_error, call
from celery_singleton_lock.exceptions import LockBackendError, WeightAboveLimit

__all__ = ["ScriptCall", "ScriptCalls", "ScriptedProtocol", "extend_all"]

_ACQUIRE = SCRIPTS["acquire"]
_RELEASE = SCRIPTS["release"]
_EXTEND = SCRIPTS["extend"]
_ACQUIRE_SLOTS = SCRIPTS["acquire_slots"]


class ScriptCall(NamedTuple):
    """One EVALSHA to send: the script, how many of ``args`` are keys, and the keys then
    the arguments."""

    script: Script
    numkeys: int
    args: tuple[bytes | int | str, ...]


class ScriptCalls:
    """What each scripted operation of one lock sends and what its reply means, with no
    I/O: the sync protocol below and the asyncio one (:mod:`.aio_protocol`) both build
    their calls and read their replies here. Arguments that never change for the lock are
    encoded once."""

    def __init__(self, keys: LockKeys) -> None:
        self.limit = keys.limit
        self._name_b = keys.name.encode()
        self._queue_b = keys.queue_key.encode()
        self._info_b = keys.info.encode()
        self._limit_b = str(keys.limit).encode()
        self._group_b = keys.group.encode()
        self._fair_ms = keys.fair_ms
        self._stack_b = keys.stack.spec().encode() if keys.stack is not None else None
        self._stacked = keys.stacked
        self._finished_b = keys.unless_finished.encode()

    def acquire(
        self, token: str, lease_ms: int, mode: bytes, claim: str = "", poll_ms: int = 1000
    ) -> ScriptCall:
        """ACQUIRE (ACQUIRE_SLOTS with several slots); its reply: ``attempt``."""
        args: tuple[bytes | int | str, ...] = (token, lease_ms, self._info_b, mode, poll_ms)
        if self.limit > 1:
            args += (self._limit_b, self._group_b)
        if self._finished_b:
            args += (claim, self._stack_b or b"", self._finished_b)
        elif self._stack_b is not None:
            args += (claim, self._stack_b)
        elif claim:
            args += (claim,)
        script = _ACQUIRE_SLOTS if self.limit > 1 else _ACQUIRE
        return ScriptCall(script, 2, (self._name_b, self._queue_b, *args))

    def attempt(self, result: Any) -> Attempt:
        """ACQUIRE's reply: acquired with the fencing token (and the slot taken, with
        several), or held, with the milliseconds until the holder's lease ends.
        ``WeightAboveLimit`` when the weight is above a stacked limit's number (refused for
        good: the script has taken the caller out of every queue and line)."""
        if int(result[0]) != 1:
            if int(result[0]) == 2:  # the unless_finished task id's run finished
                return Attempt(False, 0, finished=True)
            if len(result) > 4:  # the weight can never fit in that limit
                limit = result[2]
                raise WeightAboveLimit(
                    self._name_b.decode(),
                    limit.decode() if isinstance(limit, bytes) else str(limit),
                    int(result[3]),
                    int(result[4]),
                )
            if len(result) > 2:  # held back by a stacked limit
                limit = result[2]
                return Attempt(
                    False,
                    int(result[1]),
                    None,
                    limit.decode() if isinstance(limit, bytes) else limit,
                )
            return Attempt(False, int(result[1]))
        if self.limit > 1:
            slot = result[3]
            return Attempt(
                True, int(result[1]), slot.decode() if isinstance(slot, bytes) else str(slot)
            )
        return Attempt(True, int(result[1]))

    def release(
        self, token: str, record: tuple[str, str, int] | None = None, key: str | None = None
    ) -> ScriptCall:
        """RELEASE of ``key`` (the lock key, or a slot); its reply is an int (0 not owned,
        1 released, 2 released and waiters signalled, 3 handed over)."""
        target = key or self._name_b
        fair: tuple[int, ...] = (self._fair_ms,) if self._fair_ms else ()
        if self._stacked:  # ARGV[6]: read the hold's stack record
            where, value, ttl_ms = record or ("", "", 0)
            keys = (target, self._queue_b, where) if record else (target, self._queue_b)
            return ScriptCall(
                _RELEASE,
                len(keys),
                (*keys, token, self._limit_b, value, ttl_ms, self._fair_ms, b"1"),
            )
        if record is None:
            if fair:
                return ScriptCall(
                    _RELEASE, 2, (target, self._queue_b, token, self._limit_b, "", 0, *fair)
                )
            return ScriptCall(_RELEASE, 2, (target, self._queue_b, token, self._limit_b))
        where, value, ttl_ms = record
        return ScriptCall(
            _RELEASE,
            3,
            (target, self._queue_b, where, token, self._limit_b, value, ttl_ms, *fair),
        )

    def extend(self, token: str, lease_ms: int, key: str | None = None) -> ScriptCall:
        """EXTEND of ``key``; its reply is the new expiry (ms), 0 when not owned."""
        target = key or self._name_b
        if self._stacked:  # ARGV[4]: the shares follow the lease
            return ScriptCall(_EXTEND, 1, (target, token, lease_ms, b"s", b"1"))
        if self.limit > 1:  # the slot index follows the slot's lease (EXTEND's ARGV[3])
            return ScriptCall(_EXTEND, 1, (target, token, lease_ms, b"s"))
        return ScriptCall(_EXTEND, 1, (target, token, lease_ms))


class ScriptedProtocol(Protocol):
    """Acquire, release and extend as one atomic script each (one round trip)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """The arguments of :class:`.protocol.Protocol`."""
        super().__init__(*args, **kwargs)
        self.calls = ScriptCalls(self)

    def _run(self, sent: ScriptCall) -> Any:
        return call(self.name, sent.script, self.client, sent.numkeys, *sent.args)

    def acquire(
        self, token: str, lease_ms: int, mode: bytes, claim: str = "", poll_ms: int = 1000
    ) -> Attempt:
        return self.calls.attempt(
            self._run(self.calls.acquire(token, lease_ms, mode, claim, poll_ms))
        )

    def release(
        self, token: str, record: tuple[str, str, int] | None = None, key: str | None = None
    ) -> int:
        return int(self._run(self.calls.release(token, record, key)))

    def extend(self, token: str, lease_ms: int, key: str | None = None) -> int:
        return int(self._run(self.calls.extend(token, lease_ms, key)))


def extend_all(
    client: redis.Redis, calls: list[tuple[str, str, str, int]]
) -> list[int | LockBackendError]:
    """Extend several leases on one server in one pipelined round trip. ``calls`` holds
    ``(lock name, key, owner token, lease ms)`` each; the answer holds, per call, EXTEND's
    reply (the new expiry, 0 when not owned) or the ``LockBackendError`` about it.

    A key other than its lock's name is a slot; the lock key may be slot 1 of a lock with
    slots: EXTEND is asked to keep the slot index in step for every call (ARGV[3]), which
    writes nothing for a lock that has none."""

    def send() -> list[Any]:
        pipe = cast("Any", client.pipeline(transaction=False))  # execute_command is untyped
        for _, key, token, lease_ms in calls:
            pipe.execute_command("EVALSHA", _EXTEND.sha, 1, key, token, lease_ms, b"s")
        replies: list[Any] = pipe.execute(raise_on_error=False)
        return replies

    try:
        replies = send()
        if any(isinstance(reply, redis.exceptions.NoScriptError) for reply in replies):
            client.script_load(_EXTEND.source)  # a restarted or failed-over server
            replies = send()
    except redis.RedisError as exc:
        return [backend_error(exc, name) for name, *_ in calls]
    return [
        backend_error(reply, name) if isinstance(reply, Exception) else int(reply)
        for (name, *_), reply in zip(calls, replies, strict=True)
    ]
