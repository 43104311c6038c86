"""An acquire whose reply is lost (the connection drops after the server ran it) must not
leave the lock held while the caller believes it failed: one check by token settles it."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_singleton_lock import LockBackendError, RedisLock
from celery_singleton_lock.testing import RedisServer


class ReplyDropper:
    """A loopback TCP proxy to a real redis-server. Once ``arm(marker)`` is called, the
    next command containing ``marker`` reaches the server, but its reply is thrown away
    and the client's connection is cut, as when a network drops mid-call."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.marker: bytes | None = None
        self.dropped = threading.Event()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, marker: bytes) -> None:
        self.marker = marker

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream_port))
            self._sockets += [client, server]
            mute = threading.Event()
            threading.Thread(target=self._up, args=(client, server, mute), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, mute), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket, mute: threading.Event) -> None:
        tail = b""  # the end of the last chunk: a marker may straddle two reads
        while data := _recv(client):
            seen, tail = tail + data, data[-64:]
            if self.marker is not None and self.marker in seen:
                self.marker = None
                mute.set()
                server.sendall(data)
                time.sleep(0.2)  # the server has run it
                for side in (client, server):
                    side.close()
                self.dropped.set()
                return
            server.sendall(data)

    def _down(self, server: socket.socket, client: socket.socket, mute: threading.Event) -> None:
        while data := _recv(server):
            if mute.is_set():
                return
            try:
                client.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        self.listener.close()
        for side in self._sockets:
            side.close()


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


@pytest.fixture
def dropper(redis_server: RedisServer) -> Iterator[ReplyDropper]:
    proxy = ReplyDropper(redis_server.port)
    yield proxy
    proxy.close()


@pytest.mark.parametrize(
    ("scripting", "marker"),
    [(True, b"EVALSHA"), (False, b"$2\r\nNX\r\n")],
    ids=["scripted", "plain"],
)
def test_acquire_with_a_lost_reply_reports_the_hold(
    dropper: ReplyDropper, client: redis.Redis, key: str, scripting: bool, marker: bytes
) -> None:
    through = redis.Redis(
        host="127.0.0.1", port=dropper.port, socket_timeout=5, retry=Retry(NoBackoff(), 0)
    )
    warm = RedisLock(through, key + ":warm", timeout=5, scripting=scripting)
    assert warm.acquire(blocking=False)  # loads the scripts through the proxy first
    warm.release()
    lock = RedisLock(through, key, timeout=5, scripting=scripting)
    dropper.arm(marker)
    assert lock.acquire(blocking=False)
    assert dropper.dropped.is_set(), "the proxy never dropped a reply: the test proves nothing"
    observer = RedisLock(client, key, timeout=5)
    holder = observer.holder()
    assert holder is not None
    assert holder.token == lock.token
    assert lock.fencing_token == holder.fence
    lock.release()
    assert not observer.locked()
    through.close()


def test_lost_reply_of_a_failed_acquire_is_still_an_error(
    dropper: ReplyDropper, client: redis.Redis, key: str
) -> None:
    """When the lost reply was "held by someone else", the check finds another owner and
    the caller gets the connection error (LockBackendError), not a hold."""
    other = RedisLock(client, key, timeout=5)
    assert other.acquire(blocking=False)
    through = redis.Redis(
        host="127.0.0.1", port=dropper.port, socket_timeout=5, retry=Retry(NoBackoff(), 0)
    )
    warm = RedisLock(through, key + ":warm", timeout=5)
    assert warm.acquire(blocking=False)
    warm.release()
    dropper.arm(b"EVALSHA")
    with pytest.raises(LockBackendError):
        RedisLock(through, key, timeout=5).acquire(blocking=False)
    assert other.owned()
    other.release()
    through.close()
