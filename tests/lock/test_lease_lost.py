"""``lease_lost`` turns True by the clock when a lease's deadline passes without a
confirmed renewal (a stalled server cannot delay it), and a late reply about an earlier
hold never marks the current hold as lost."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any, ClassVar

import redis

from celery_singleton_lock import RedisLock
from celery_singleton_lock.engine.protocol import Protocol
from celery_singleton_lock.engine.scripted import ScriptedProtocol
from celery_singleton_lock.testing import RedisServer
from tests.worker.conftest import wait_for


def test_stalled_server_does_not_delay_lease_lost(fresh_server: RedisServer) -> None:
    """SIGSTOP the server under an auto-renewed 1 s lease whose client waits up to 100 s per
    call: lease_lost is True about a lease later, not after the socket timeout (the 30 s
    bound leaves a busy machine plenty)."""
    client = redis.Redis.from_url(fresh_server.url, socket_timeout=100)
    lock = RedisLock(client, "stall:{a}", timeout=1.0, auto_renew=True)
    assert lock.acquire(blocking=False)
    assert fresh_server.pid is not None
    os.kill(fresh_server.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        assert wait_for(lambda: lock.lease_lost, timeout=30)
        assert time.monotonic() - stopped < 30  # the socket timeout (100 s) did not matter
    finally:
        os.kill(fresh_server.pid, signal.SIGCONT)
    client.close()


def test_lease_lost_without_renewal_once_the_lease_ends(client: redis.Redis, key: str) -> None:
    lock = RedisLock(client, key, timeout=0.3)
    assert lock.acquire(blocking=False)
    assert not lock.lease_lost
    assert wait_for(lambda: lock.lease_lost, timeout=30)
    lock2 = RedisLock(client, key, timeout=5)
    assert wait_for(lambda: lock2.acquire(blocking=False), timeout=30)
    lock2.release()


class _HeldExtend(ScriptedProtocol):
    """The scripted protocol on a real server, whose extend can be held back and then
    answered "not owned", as a reply that arrives after the hold it was about ended."""

    gate: ClassVar[threading.Event] = threading.Event()
    entered: ClassVar[threading.Event] = threading.Event()

    def extend(self, token: str, lease_ms: int, key: str | None = None) -> int:
        self.entered.set()
        assert self.gate.wait(10)
        return 0


class _StaleReplyLock(RedisLock):
    protocols: ClassVar[dict[bool, type[Protocol]]] = {True: _HeldExtend, False: _HeldExtend}


def test_stale_renewal_reply_does_not_mark_a_newer_hold_lost(client: redis.Redis, key: str) -> None:
    lock = _StaleReplyLock(client, key, timeout=30, auto_renew=True)
    assert lock.acquire(blocking=False)
    first = lock._hold()
    results: list[Any] = []
    renewal = threading.Thread(target=lambda: results.append(lock._renew(first)))
    renewal.start()
    assert _HeldExtend.entered.wait(10)
    lock.release()  # that hold ends while its renewal is still in flight...
    assert lock.acquire(blocking=False)  # ...and a new hold begins
    _HeldExtend.gate.set()  # the old renewal now hears "not owned"
    renewal.join(10)
    assert results == [None]
    assert not lock.lease_lost
    assert lock.owned()
    lock.release()
