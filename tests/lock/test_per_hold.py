"""Ownership belongs to one hold, never to the object: threads sharing an instance and a
child forked while it was held contend like anyone else; the holding thread re-acquiring
gets LockError."""

from __future__ import annotations

import multiprocessing
import threading
import time
from typing import Any, ClassVar

import pytest
import redis

from celery_singleton_lock import LockError, LockNotOwned, RedisLock
from celery_singleton_lock.engine.protocol import Protocol
from celery_singleton_lock.engine.scripted import ScriptedProtocol


def test_threads_sharing_one_instance_lose_no_update(
    client: redis.Redis, key: str, make_lock: Any
) -> None:
    """Eight threads share ONE RedisLock around a read-increment-write of a Redis counter:
    all 400 increments survive (a lock owned by the object would let threads overlap)."""
    lock = make_lock(timeout=10, fallback_poll=0.2)
    counter = f"{key}:counter"
    inside: list[int] = []
    overlaps: list[int] = []

    def work() -> None:
        for _ in range(50):
            assert lock.acquire(timeout=30)
            inside.append(1)
            if len(inside) > 1:
                overlaps.append(len(inside))
            value = int(client.get(counter) or 0)
            time.sleep(0.0005)
            client.set(counter, value + 1)
            inside.pop()
            lock.release()

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not overlaps
    assert int(client.get(counter) or 0) == 400


def test_another_thread_contends_and_the_holder_cannot_reenter(make_lock: Any) -> None:
    """While the main thread holds an instance, another thread's acquire on it fails or
    waits, the main thread's own re-acquire raises LockError, and the other thread gets it
    (with a larger fencing token) once the holder releases."""
    lock = make_lock(timeout=10, fallback_poll=0.2)
    assert lock.acquire(blocking=False)
    first = lock.fencing_token
    with pytest.raises(LockError, match="already holds"):
        lock.acquire(blocking=False)
    seen: dict[str, Any] = {}

    def other() -> None:
        seen["try"] = lock.acquire(blocking=False)
        seen["wait"] = lock.acquire(timeout=0.3)
        seen["later"] = lock.acquire(timeout=10)
        seen["fence"] = lock.fencing_token
        lock.release()

    thread = threading.Thread(target=other)
    thread.start()
    time.sleep(0.6)
    lock.release()  # the main thread's hold
    thread.join(15)
    assert seen["try"] is False
    assert seen["wait"] is False
    assert seen["later"] is True
    assert seen["fence"] > first
    assert not lock.locked()


def test_release_from_another_thread_when_one_thread_holds(make_lock: Any) -> None:
    """A lock taken in one thread may be released from another (the one hold of this
    instance), as threading.Lock allows; a second release finds nothing to release."""
    lock = make_lock(timeout=10)
    taken = threading.Event()
    threading.Thread(target=lambda: (lock.acquire(), taken.set())).start()
    assert taken.wait(5)
    assert lock.owned()
    assert lock.fencing_token is not None
    lock.release()
    assert not lock.locked()
    with pytest.raises(LockNotOwned):
        lock.release()


def test_a_thread_whose_acquire_failed_neither_owns_nor_releases(make_lock: Any) -> None:
    """A thread that contended for an instance another thread holds (its acquire failed)
    sees what any contender sees: not owned, no fencing token, nothing to release or
    extend; the holder still holds it afterwards."""
    lock = make_lock(timeout=10)
    assert lock.acquire(blocking=False)
    report: dict[str, Any] = {}

    def contender() -> None:
        report["acquired"] = lock.acquire(blocking=False)
        report["owned"] = lock.owned()
        report["fence"] = lock.fencing_token
        report["lost"] = lock.lease_lost
        for name, call in (("release", lock.release), ("extend", lock.extend)):
            try:
                call()
                report[name] = "done"
            except LockNotOwned:
                report[name] = "not owned"

    thread = threading.Thread(target=contender)
    thread.start()
    thread.join(15)
    assert report == {
        "acquired": False, "owned": False, "fence": None, "lost": False,
        "release": "not owned", "extend": "not owned",
    }  # fmt: skip
    assert lock.owned()
    lock.release()
    assert not lock.locked()


def _in_child(lock: RedisLock, out: Any) -> None:
    """Report what a forked child sees of the lock its parent holds."""
    report: dict[str, Any] = {
        "owned": lock.owned(),
        "fence": lock.fencing_token,
        "acquired": lock.acquire(blocking=False),
    }
    try:
        lock.release()
        report["release"] = "released"
    except LockNotOwned:
        report["release"] = "not owned"
    out.send(report)


def test_a_forked_child_does_not_hold_its_parents_lock(make_lock: Any) -> None:
    """A child forked while the parent holds the lock neither owns it, nor can take it,
    nor can release it; the parent still holds it afterwards."""
    lock = make_lock(timeout=10)
    assert lock.acquire(blocking=False)
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_in_child, args=(lock, send))
    child.start()
    try:
        assert receive.poll(15)
        report = receive.recv()
    finally:
        child.join(10)
        child.kill()
    assert report == {"owned": False, "fence": None, "acquired": False, "release": "not owned"}
    assert lock.owned()
    lock.release()


def test_threads_of_one_fixed_token_take_turns(make_lock: Any) -> None:
    """With a fixed owner token the server cannot tell two threads apart, so the instance
    makes them take turns: the second thread gets it only after the first released."""
    lock = make_lock(timeout=10, token="shared-owner")
    assert lock.acquire(blocking=False)
    seen: dict[str, Any] = {}

    def other() -> None:
        seen["try"] = lock.acquire(blocking=False)
        started = time.monotonic()
        seen["later"] = lock.acquire(timeout=10)
        seen["waited"] = time.monotonic() - started
        lock.release()

    thread = threading.Thread(target=other)
    thread.start()
    time.sleep(0.4)
    lock.release()
    thread.join(15)
    assert seen["try"] is False
    assert seen["later"] is True
    assert seen["waited"] > 0.2


class _SlowRelease(ScriptedProtocol):
    """The scripted protocol on a real server, whose release reaches the server 0.3 s late
    (a slow link, or the several round trips of plain mode)."""

    def release(
        self, token: str, record: tuple[str, str, int] | None = None, key: str | None = None
    ) -> int:
        time.sleep(0.3)
        return super().release(token, record, key)


class _SlowReleaseLock(RedisLock):
    protocols: ClassVar[dict[bool, type[Protocol]]] = {True: _SlowRelease, False: _SlowRelease}


def test_the_next_fixed_token_thread_waits_until_the_release_reached_the_server(
    client: redis.Redis, key: str
) -> None:
    """A second thread of a fixed-token owner presents the same token: its turn starts only
    once the first thread's release has reached the server, or that late release would
    delete the second thread's hold."""
    lock = _SlowReleaseLock(client, key, timeout=10, token="shared-owner")
    assert lock.acquire(blocking=False)
    seen: dict[str, Any] = {}

    def other() -> None:
        seen["got"] = lock.acquire(timeout=10)
        time.sleep(0.5)  # past the first thread's late release
        seen["owned"] = lock.owned()
        try:
            lock.release()
            seen["released"] = True
        except LockNotOwned:
            seen["released"] = False

    thread = threading.Thread(target=other)
    thread.start()
    time.sleep(0.2)
    lock.release()
    thread.join(15)
    assert seen == {"got": True, "owned": True, "released": True}


def test_fixed_token_instance_releases_that_owners_hold(make_lock: Any) -> None:
    """An instance built with a holder's token releases that hold without acquiring (how a
    worker parent frees a dead child's lock)."""
    holder = make_lock(timeout=10)
    assert holder.acquire(blocking=False)
    assert holder.token is not None
    make_lock(token=holder.token).release()
    assert not holder.locked()


def test_each_hold_gets_its_own_owner_token(make_lock: Any) -> None:
    """Two successive holds of one instance have different owner tokens, so a reply or a
    release meant for the first can never act on the second."""
    lock = make_lock(timeout=10)
    assert lock.acquire(blocking=False)
    first = lock.token
    lock.release()
    assert lock.token is None
    assert lock.acquire(blocking=False)
    assert lock.token != first
    lock.release()
