"""``RedisLock(..., replicas=N)``: every acquire and extension waits (Redis ``WAIT``) until N
replicas have it, and undoes or refuses what they did not acknowledge in time.

A real master and a real replica; the replica reaches the master through a
:class:`~celery_singleton_lock.testing.FaultProxy`, so a test can stall replication (the
replica then neither receives writes nor acknowledges offsets) without stopping either
server.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import redis

from celery_singleton_lock import LockBackendError, LockError, RedisLock
from celery_singleton_lock.engine.wire import wait_for_replicas
from celery_singleton_lock.testing import FaultProxy, RedisServer

pytestmark = pytest.mark.slow


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``predicate`` every 20 ms until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


@dataclass
class Replicated:
    """A master, its replica, and the proxy on the replication link between them."""

    master: RedisServer
    replica: RedisServer
    link: FaultProxy

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.master.port, socket_timeout=5)

    def replica_client(self) -> redis.Redis:
        return redis.Redis(port=self.replica.port, socket_timeout=5)


def _link_up(replica: RedisServer) -> bool:
    with redis.Redis(port=replica.port, socket_timeout=1) as client:
        info = client.info("replication")
    return info.get("master_link_status") == "up"


@pytest.fixture(scope="module")
def replicated() -> Iterator[Replicated]:
    """A master with one replica replicating through a fault proxy (module-wide)."""
    with RedisServer() as master, FaultProxy(master.port) as link:
        replica = RedisServer(extra_args=("--replicaof", "127.0.0.1", str(link.port)))
        with replica:
            wait_until(lambda: _link_up(replica), 20, "the replica to sync")
            yield Replicated(master, replica, link)


@pytest.fixture
def pair(replicated: Replicated) -> Iterator[Replicated]:
    """The replicated pair with the link flowing and in sync at the start and end of a test."""
    replicated.link.resume()
    wait_until(lambda: _link_up(replicated.replica), 20, "the replica link")
    yield replicated
    replicated.link.resume()


def _wait_replicated(pair: Replicated, name: str) -> None:
    with pair.client() as master, pair.replica_client() as replica:
        wait_until(lambda: replica.get(name) == master.get(name), 10, "the replica to catch up")


@pytest.mark.parametrize("scripting", [True, False], ids=["scripting", "plain"])
def test_acquire_returns_only_once_the_replica_has_the_lock(
    pair: Replicated, key: str, scripting: bool
) -> None:
    """With replicas=1, the moment acquire returns the replica already holds the same value
    as the master, for a fresh acquire and for a hand-off to a waiter. (The replica is
    given 5 s to acknowledge: on a loaded machine the proxied link took more than 0.5 s.)"""
    with pair.client() as client, pair.replica_client() as replica:
        first = RedisLock(
            client, key, timeout=10, replicas=1, replicas_timeout=5, scripting=scripting
        )
        assert first.acquire(blocking=False)
        assert replica.get(key) == client.get(key)
        assert first.token is not None
        assert first.token.encode() in (replica.get(key) or b"")
        waiter = RedisLock(
            client, key, timeout=10, replicas=1, replicas_timeout=5, scripting=scripting
        )
        got: list[bool] = []
        thread = threading.Thread(target=lambda: got.append(waiter.acquire(timeout=10)))
        thread.start()
        time.sleep(0.3)  # the waiter is queued
        first.release()
        thread.join(10)
        assert got == [True]
        assert waiter.token is not None
        assert waiter.token.encode() in (replica.get(key) or b"")
        waiter.release()


@pytest.mark.parametrize("scripting", [True, False], ids=["scripting", "plain"])
def test_unacknowledged_acquire_is_undone_and_raises(
    pair: Replicated, key: str, scripting: bool
) -> None:
    """Replication stalled: acquire(replicas=1) raises LockBackendError after about
    replicas_timeout and leaves the lock free on the master (a rival takes it), while
    replicas=0 acquires as before."""
    with pair.client() as client:
        lock = RedisLock(
            client, key, timeout=10, replicas=1, replicas_timeout=0.3, scripting=scripting
        )
        pair.link.stall()
        started = time.monotonic()
        with pytest.raises(LockBackendError, match="only 0 of 1 replicas"):
            lock.acquire(blocking=False)
        # it waited for the replica (not sooner); the upper bound only says it gave up
        # rather than hanging, with room for a busy machine
        assert 0.25 <= time.monotonic() - started < 30
        assert not lock.locked()
        assert lock.fencing_token is None
        rival = RedisLock(client, key, timeout=10, scripting=scripting)
        assert rival.acquire(blocking=False)
        rival.release()


def test_unacknowledged_hand_off_is_given_back(pair: Replicated, key: str) -> None:
    """A waiter with replicas=1 handed the lock while replication is stalled raises
    LockBackendError and gives the lock back instead of holding it unreplicated."""
    with pair.client() as client:
        holder = RedisLock(client, key, timeout=10)
        assert holder.acquire(blocking=False)
        waiter = RedisLock(client, key, timeout=10, replicas=1, replicas_timeout=0.3)
        errors: list[BaseException] = []

        def wait() -> None:
            try:
                waiter.acquire(timeout=10)
            except LockBackendError as exc:
                errors.append(exc)

        thread = threading.Thread(target=wait)
        thread.start()
        time.sleep(0.3)
        pair.link.stall()
        holder.release()
        thread.join(10)
        assert len(errors) == 1
        assert not holder.locked()


def test_unacknowledged_extension_raises_and_the_lease_is_then_lost(
    pair: Replicated, key: str
) -> None:
    """Replication stalled: extend() raises LockBackendError and does not count as a
    confirmed renewal, so the auto-renewed lease turns lease_lost by the clock."""
    with pair.client() as client:
        lock = RedisLock(
            client, key, timeout=1.0, replicas=1, replicas_timeout=0.2, auto_renew=True
        )
        assert lock.acquire(blocking=False)
        pair.link.stall()
        with pytest.raises(LockBackendError, match="replicas"):
            lock.extend()
        assert not lock.lease_lost
        wait_until(lambda: lock.lease_lost, 30, "lease_lost")
        pair.link.resume()
        with contextlib.suppress(LockError):  # lost by the clock; the master may agree
            lock.release()


def test_wait_covers_writes_made_on_another_connection(pair: Replicated, key: str) -> None:
    """WAIT alone counts only its own connection's writes; wait_for_replicas still waits for
    a write that another connection made (a grant written by the releaser's script)."""
    with pair.client() as waiter, pair.client() as releaser:
        waiter.ping()  # the waiter's connection exists and has written nothing
        assert wait_for_replicas(waiter, key, key + ":sync", 1, 2000) == 1
        pair.link.stall()
        releaser.set(key, b"granted")
        started = time.monotonic()
        assert wait_for_replicas(waiter, key, key + ":sync", 1, 300) == 0
        assert time.monotonic() - started >= 0.25


@pytest.mark.parametrize(
    ("keyword", "value"),
    [
        ("replicas", -1),
        ("replicas", True),
        ("replicas", 1.5),
        ("replicas", "1"),
        ("replicas_timeout", 0),
        ("replicas_timeout", float("nan")),
        ("replicas_timeout", float("inf")),
        ("replicas_timeout", -1),
    ],
)
def test_bad_replica_settings_are_refused(keyword: str, value: object) -> None:
    """replicas must be an int >= 0 and replicas_timeout a positive finite number."""
    client = redis.Redis(port=1)  # never connected
    with pytest.raises(ValueError, match=keyword):
        RedisLock(client, "x", **{keyword: value})  # type: ignore[arg-type]


def test_lock_replicas_option_reaches_the_task_lock(pair: Replicated) -> None:
    """A LockedTask with lock_replicas=1 holds a lock that the replica already has when the
    body starts (the option table feeds RedisLock(replicas=...))."""
    from celery import Celery  # noqa: PLC0415 - only this test needs Celery

    from celery_singleton_lock import LockedTask, current_lock  # noqa: PLC0415

    app = Celery("replicated", broker="memory://", set_as_current=False)
    app.conf.update(task_always_eager=True, singleton_lock_url=pair.master.url)
    seen: list[tuple[int, bytes | None, str | None]] = []

    @app.task(base=LockedTask, name="replicated.job", lock_replicas=1)
    def job(x: int) -> None:
        held = current_lock()
        assert held is not None
        with pair.replica_client() as replica:
            seen.append((held.replicas, replica.get(held.name), held.token))

    job.delay(1).get()
    ((replicas, value, token),) = seen
    assert replicas == 1
    assert token is not None
    assert value is not None
    assert token.encode() in value
