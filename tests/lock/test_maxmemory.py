"""At ``maxmemory`` with ``noeviction`` Redis refuses every write that may need memory (and
every command queued in MULTI): holders must still release, and renew in scripted mode,
while new acquisitions fail with a clear error."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from celery_singleton_lock import LockBackendError, LockNotOwned, RedisLock
from celery_singleton_lock.testing import RedisServer


def _fill_to_maxmemory(client: redis.Redis) -> None:
    """Put the memory limit below what the server already uses (noeviction): from now on
    it refuses every write that may need memory."""
    client.config_set("maxmemory-policy", "noeviction")
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", used - 50_000)
    with pytest.raises(redis.exceptions.ResponseError, match="maxmemory"):
        client.set("probe", "refused")


@pytest.fixture
def server() -> Iterator[RedisServer]:
    """A private server for one test: it is filled to its memory limit."""
    with RedisServer() as private:
        yield private


def _client(server: RedisServer) -> redis.Redis:
    return redis.Redis.from_url(server.url, socket_timeout=5)


def test_release_at_maxmemory_deletes_the_hold(server: RedisServer, scripting: bool) -> None:
    """A holder releases while the server refuses writes, and the key is gone afterwards."""
    client = _client(server)
    lock = RedisLock(client, "oom:release", timeout=30, scripting=scripting)
    assert lock.acquire(blocking=False)
    _fill_to_maxmemory(client)
    lock.release()
    assert client.get("oom:release") is None


def test_release_at_maxmemory_is_still_owner_checked(server: RedisServer, scripting: bool) -> None:
    """At maxmemory, a holder whose lease was taken over still cannot delete its successor."""
    client = _client(server)
    late = RedisLock(client, "oom:owner", timeout=0.3, scripting=scripting)
    successor = RedisLock(client, "oom:owner", timeout=30, scripting=scripting)
    assert late.acquire(blocking=False)
    time.sleep(0.35)
    assert successor.acquire(blocking=False)
    _fill_to_maxmemory(client)
    with pytest.raises(LockNotOwned):
        late.release()
    assert successor.owned()


def test_scripted_extend_and_renewal_work_at_maxmemory(server: RedisServer) -> None:
    """A scripted holder's renewer keeps a 1.5 s lease alive for 3.2 s (over two leases)
    while the server is at maxmemory, and an explicit extend() succeeds. (Renewed every
    0.5 s: only a process starved for a second could lose it on its own.)"""
    client = _client(server)
    lock = RedisLock(client, "oom:renew", timeout=1.5, auto_renew=True)
    assert lock.acquire(blocking=False)
    _fill_to_maxmemory(client)
    lock.extend()
    time.sleep(3.2)
    assert lock.owned()
    assert not lock.lease_lost
    lock.release()
    assert client.get("oom:renew") is None


def test_plain_extend_at_maxmemory_says_why(server: RedisServer) -> None:
    """Plain mode cannot rewrite the value at maxmemory: extend() raises LockBackendError
    that names maxmemory, and the hold is left as it was."""
    client = _client(server)
    lock = RedisLock(client, "oom:plain", timeout=30, scripting=False)
    assert lock.acquire(blocking=False)
    _fill_to_maxmemory(client)
    with pytest.raises(LockBackendError, match="maxmemory"):
        lock.extend()
    assert lock.owned()
    lock.release()


def test_acquire_at_maxmemory_fails_clearly(server: RedisServer, scripting: bool) -> None:
    """A new acquisition at maxmemory raises LockBackendError naming maxmemory (never a
    silent False), and a contender of a held lock is simply told it is held."""
    client = _client(server)
    holder = RedisLock(client, "oom:held", timeout=30, scripting=scripting)
    assert holder.acquire(blocking=False)
    _fill_to_maxmemory(client)
    with pytest.raises(LockBackendError, match="maxmemory"):
        RedisLock(client, "oom:free", scripting=scripting).acquire(blocking=False)
    contender = RedisLock(client, "oom:held", scripting=scripting)
    assert not contender.acquire(timeout=0.3)
    holder.release()
