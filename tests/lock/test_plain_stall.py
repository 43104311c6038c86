"""Plain mode on a server that stops answering inside a WATCH transaction: the error
surfaces as LockBackendError, never as a raw redis-py exception (a task run maps only
LockBackendError to "retry later"; anything else fails the task and, with acks_late, drops
its message)."""

from __future__ import annotations

import os
import signal

import pytest
import redis

from celery_singleton_lock import LockBackendError
from celery_singleton_lock.testing import RedisServer
from tests.lock.test_plain_protocol import Interleaved

pytestmark = pytest.mark.slow


def test_server_stopped_mid_transaction_is_a_lock_backend_error(
    fresh_server: RedisServer, key: str
) -> None:
    """A plain acquire taking over an expired value while the server stops (SIGSTOP)
    between its WATCH and its MULTI/EXEC raises LockBackendError, and the lock can be taken
    again once the server answers (at the latest when that attempt's lease ends)."""
    client = redis.Redis(port=fresh_server.port, socket_timeout=0.3, socket_connect_timeout=0.3)
    client.set(key, "1000")  # a classic timestamp long past: the take-over path
    assert fresh_server.pid is not None
    pid = fresh_server.pid

    lock = Interleaved(
        client, key, at="before-getset", rival=lambda: os.kill(pid, signal.SIGSTOP), timeout=1
    )
    try:
        with pytest.raises(LockBackendError):
            lock.acquire(blocking=False)
    finally:
        os.kill(pid, signal.SIGCONT)
    # The stopped server still had the transaction in its socket buffer: it may run it when
    # it resumes, granting a 1 s lease to an attempt that already gave up.
    again = Interleaved(client, key, at="", rival=None, timeout=5)
    assert again.acquire(timeout=5)
    again.release()
    client.close()  # its connections, the one dropped mid-transaction included
