"""A child forked while another thread of its parent was inside a lock (issue 22.8), and a
hold whose thread ended (issue 22.9): the child and the survivors can still use the lock."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import pytest
import redis

from celery_singleton_lock import LockNotOwned, RedisLock
from celery_singleton_lock.engine.renewal import renewer
from celery_singleton_lock.testing import RedisServer

#: Python 3.12+ warns that fork() in a threaded process may deadlock the child: exactly
#: what these tests show the lock survives.
pytestmark = pytest.mark.filterwarnings("ignore:This process .* is multi-threaded")


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as started:
        yield started


def _child_exit_status(pid: int, timeout: float) -> int | None:
    """The child's exit status, or None (and it is killed) when it hangs past ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return None


def _fork_while_held(mutex: threading.Lock, use: object) -> int | None:
    """Fork while a thread of ours is inside ``mutex`` (as a thread inside a lock method
    is); the child calls ``use()`` and exits 0 if it returned."""
    inside, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with mutex:
            inside.set()
            leave.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    assert inside.wait(5)
    pid = os.fork()
    if pid == 0:  # the child: the holding thread does not exist here
        code = 1
        try:
            use()  # type: ignore[operator]
            code = 0
        finally:
            os._exit(code)
    leave.set()
    thread.join(5)
    return _child_exit_status(pid, 10)


@pytest.mark.parametrize("scripting", [True, False])
def test_a_child_forked_while_a_thread_was_inside_the_lock_can_use_it(
    server: RedisServer, scripting: bool
) -> None:
    """The child takes and releases the very instance its parent's thread was using."""
    client = redis.Redis(port=server.port, socket_timeout=5)
    lock = RedisLock(client, f"fork:{scripting}", timeout=5, scripting=scripting)

    def use() -> None:
        child = redis.Redis(port=server.port, socket_timeout=5)
        lock.client = child
        lock.protocol.client = child
        assert lock.acquire(blocking=False)
        lock.release()

    assert _fork_while_held(lock._mutex, use) == 0
    client.close()


def test_a_child_forked_while_the_renewer_was_busy_can_renew(server: RedisServer) -> None:
    """The renewer's own mutex held by a parent thread at the fork does not stop the child
    from taking an auto-renewed lock (which schedules its renewal)."""
    lock_name = "fork:renewer"

    def use() -> None:
        child = redis.Redis(port=server.port, socket_timeout=5)
        lock = RedisLock(child, lock_name, timeout=5, auto_renew=True)
        assert lock.acquire(blocking=False)
        lock.release()

    assert _fork_while_held(renewer._mutex, use) == 0


def test_a_hold_whose_thread_ended_can_be_released_by_a_contender(server: RedisServer) -> None:
    """A thread took the lock and ended without releasing it; another thread, whose acquire
    failed against that hold, may release it once the holder's thread is gone (else
    auto_renew would keep it for the life of the process). While the holder lives, it
    still may not."""
    client = redis.Redis(port=server.port, socket_timeout=5)
    lock = RedisLock(client, "fork:orphan", timeout=5, auto_renew=True)
    taken, finish = threading.Event(), threading.Event()

    def holder() -> None:
        assert lock.acquire(blocking=False)
        taken.set()
        finish.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    assert taken.wait(5)
    assert not lock.acquire(blocking=False)  # we contend with the live holder
    with pytest.raises(LockNotOwned):
        lock.release()
    finish.set()
    thread.join(5)
    lock.release()  # the holder's thread is gone: its hold can be let go
    assert not lock.locked()
    client.close()
