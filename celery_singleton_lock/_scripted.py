"""The scripted protocol: each lock operation is one EVALSHA of a script in ``_scripts``."""

from __future__ import annotations

import hashlib
from typing import Any, cast

import redis

from celery_singleton_lock import _scripts
from celery_singleton_lock._protocol import SIGNAL_TTL_MS, Attempt, Protocol, grace_ms
from celery_singleton_lock._redis import LockClient, call

__all__ = ["ScriptedProtocol"]


class _Script:
    """One protocol script: EVALSHA with pre-encoded arguments, loaded on NOSCRIPT.

    Calling ``execute_command`` directly (rather than redis-py's ``Script`` wrapper) keeps
    the hot path to one packing of already-encoded bytes.
    """

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()  # noqa: S324 - Redis names scripts by SHA1

    def __call__(self, client: LockClient, numkeys: int, *args: bytes | int | str) -> Any:
        execute = cast("Any", client).execute_command  # untyped on RedisCluster
        try:
            return execute("EVALSHA", self.sha, numkeys, *args)
        except redis.exceptions.NoScriptError:
            client.script_load(self.source)  # a restarted or failed-over server
            return execute("EVALSHA", self.sha, numkeys, *args)


_ACQUIRE = _Script(_scripts.ACQUIRE)
_RELEASE = _Script(_scripts.RELEASE)
_EXTEND = _Script(_scripts.EXTEND)


class ScriptedProtocol(Protocol):
    """Acquire, release and extend as one atomic script each (one round trip)."""

    def __init__(self, client: LockClient, name: str, signal_key: str, info: str) -> None:
        super().__init__(client, name, signal_key, info)
        # Arguments that never change for this lock, encoded once.
        self._name_b = name.encode()
        self._signal_b = signal_key.encode()
        self._info_b = info.encode()

    def acquire(self, token: str, lease_ms: int, mode: bytes, claim: str = "") -> Attempt:
        result = call(
            self.name, _ACQUIRE, self.client, 1, self._name_b, token, lease_ms,
            grace_ms(lease_ms), mode, self._info_b, claim,
        )  # fmt: skip
        return Attempt(int(result[0]) == 1, int(result[1]))

    def release(self, token: str) -> int:
        return int(
            call(
                self.name,
                _RELEASE,
                self.client,
                2,
                self._name_b,
                self._signal_b,
                token,
                SIGNAL_TTL_MS,
            )
        )

    def extend(self, token: str, lease_ms: int) -> int:
        return int(
            call(
                self.name,
                _EXTEND,
                self.client,
                1,
                self._name_b,
                token,
                lease_ms,
                grace_ms(lease_ms),
            )
        )
