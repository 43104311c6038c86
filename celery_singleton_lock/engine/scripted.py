"""The scripted protocol: each lock operation is one EVALSHA of a registered script
(:data:`.scripts.SCRIPTS`), and a release hands the lock straight to the first waiter in
line (see :mod:`.scripts`)."""

from __future__ import annotations

from typing import Any, cast

import redis

from celery_singleton_lock.engine.protocol import Attempt, Protocol
from celery_singleton_lock.engine.scripts import SCRIPTS
from celery_singleton_lock.engine.wire import LockClient, backend_error, call
from celery_singleton_lock.exceptions import LockBackendError

__all__ = ["ScriptedProtocol", "extend_all"]

_ACQUIRE = SCRIPTS["acquire"]
_RELEASE = SCRIPTS["release"]
_EXTEND = SCRIPTS["extend"]
_ACQUIRE_SLOTS = SCRIPTS["acquire_slots"]


class ScriptedProtocol(Protocol):
    """Acquire, release and extend as one atomic script each (one round trip)."""

    def __init__(
        self,
        client: LockClient,
        name: str,
        signal_key: str,
        info: str,
        *,
        limit: int = 1,
        group: str = "",
    ) -> None:
        super().__init__(client, name, signal_key, info, limit=limit, group=group)
        # Arguments that never change for this lock, encoded once.
        self._name_b = name.encode()
        self._queue_b = self.queue_key.encode()
        self._info_b = info.encode()
        self._limit_b = str(limit).encode()
        self._group_b = group.encode()

    def acquire(
        self, token: str, lease_ms: int, mode: bytes, claim: str = "", poll_ms: int = 1000
    ) -> Attempt:
        args: tuple[bytes | int | str, ...] = (token, lease_ms, self._info_b, mode, poll_ms)
        if self.limit > 1:
            args += (self._limit_b, self._group_b)
            if claim:
                args += (claim,)
            result = call(
                self.name, _ACQUIRE_SLOTS, self.client, 2, self._name_b, self._queue_b, *args
            )
            if int(result[0]) == 1:
                slot = result[3]
                return Attempt(
                    True, int(result[1]), slot.decode() if isinstance(slot, bytes) else str(slot)
                )
            return Attempt(False, int(result[1]))
        if claim:
            args += (claim,)
        result = call(self.name, _ACQUIRE, self.client, 2, self._name_b, self._queue_b, *args)
        return Attempt(int(result[0]) == 1, int(result[1]))

    def release(
        self, token: str, record: tuple[str, str, int] | None = None, key: str | None = None
    ) -> int:
        target = key or self._name_b
        if record is None:
            return int(
                call(
                    self.name, _RELEASE, self.client, 2, target, self._queue_b, token, self._limit_b
                )
            )
        where, value, ttl_ms = record
        return int(
            call(
                self.name,
                _RELEASE,
                self.client,
                3,
                target,
                self._queue_b,
                where,
                token,
                self._limit_b,
                value,
                ttl_ms,
            )
        )

    def extend(self, token: str, lease_ms: int, key: str | None = None) -> int:
        target = key or self._name_b
        if self.limit > 1:  # the slot index follows the slot's lease (EXTEND's ARGV[3])
            return int(call(self.name, _EXTEND, self.client, 1, target, token, lease_ms, b"s"))
        return int(call(self.name, _EXTEND, self.client, 1, target, token, lease_ms))


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
