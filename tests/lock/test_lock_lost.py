"""``LockLost``: ``ensure_held()`` and the watcher of ``lock_on_lost="raise"``
(``runtime.watch.watching``) on a real redis-server: a lease lost while work runs stops
the work, on the main thread (interrupting a sleep) and on another thread, and never
after the work ended."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from celery_singleton_lock import LockLost, LockNotOwned, RedisLock
from celery_singleton_lock.runtime.watch import watching


def _held(client: redis.Redis, key: str) -> RedisLock:
    lock = RedisLock(client, key, timeout=1.0, auto_renew=True)
    assert lock.acquire(blocking=False)
    return lock


def test_ensure_held_passes_while_held_and_raises_once_lost(client: redis.Redis, key: str) -> None:
    """Held: no error; the key taken away (the renewer finds it gone): LockLost; never
    acquired, or released: LockNotOwned."""
    idle = RedisLock(client, key, timeout=1.0)
    with pytest.raises(LockNotOwned):
        idle.ensure_held()
    lock = _held(client, key)
    lock.ensure_held()
    client.delete(key)
    deadline = time.monotonic() + 30
    while not lock.lease_lost and time.monotonic() < deadline:
        time.sleep(0.02)
    with pytest.raises(LockLost) as raised:
        lock.ensure_held()
    assert raised.value.name == key


def test_a_lost_lease_interrupts_a_sleeping_main_thread(client: redis.Redis, key: str) -> None:
    """A body sleeping on the main thread gets LockLost within a renewal period of the key
    being taken away (0.3 s in, 1 s lease), not after its 100 s sleep: the bound (50 s)
    leaves a busy machine most of a minute."""
    lock = _held(client, key)
    threading.Timer(0.3, client.delete, args=(key,)).start()
    began = time.monotonic()
    with pytest.raises(LockLost), watching(lock):
        time.sleep(100)
    assert time.monotonic() - began < 50
    lock.detach()


def test_a_lost_lease_stops_a_body_on_another_thread(client: redis.Redis, key: str) -> None:
    """A body looping on a worker thread (the threads pool) gets LockLost raised in it."""
    lock = RedisLock(client, key, timeout=1.0, auto_renew=True)
    caught: list[BaseException] = []

    def body() -> None:
        assert lock.acquire(blocking=False)
        try:
            with watching(lock):
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    time.sleep(0.01)
        except LockLost as exc:
            caught.append(exc)
        finally:
            lock.detach()

    worker = threading.Thread(target=body)
    worker.start()
    time.sleep(0.3)
    client.delete(key)
    worker.join(timeout=5)
    assert not worker.is_alive()
    assert len(caught) == 1
    assert isinstance(caught[0], LockLost)
    assert caught[0].name == key  # named, though CPython raised it from the class alone


def test_nothing_is_raised_after_the_block_or_while_held(client: redis.Redis, key: str) -> None:
    """A body that ends before the loss, or that keeps its lease (renewed) through several
    leases, sees no LockLost; nor does the code after the block when the lease is lost
    later."""
    lock = _held(client, key)
    with watching(lock):
        time.sleep(2.5)  # 2.5 leases, renewed
    client.delete(key)
    deadline = time.monotonic() + 30  # until the renewer finds it gone: nothing is raised here
    while not lock.lease_lost:
        assert time.monotonic() < deadline, "the renewer never found the key gone"
        time.sleep(0.02)
    lock.detach()


def test_disabled_watching_lets_the_body_run_on(client: redis.Redis, key: str) -> None:
    """lock_on_lost='warn' (enabled=False): the body runs to its end although the lease
    was lost."""
    lock = _held(client, key)
    client.delete(key)
    with watching(lock, enabled=False):
        deadline = time.monotonic() + 30  # the body goes on until the loss is known...
        while not lock.lease_lost:
            assert time.monotonic() < deadline, "the renewer never found the key gone"
            time.sleep(0.02)
        time.sleep(0.3)  # ...and past it: nothing interrupts it
    assert lock.lease_lost
    lock.detach()
