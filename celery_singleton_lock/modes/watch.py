"""``lock_on_lost="raise"``: stop a body whose lease is gone.

While such a body runs, one daemon thread per process watches its lock (``lease_lost``:
a renewal found the lock taken or expired, or the last confirmed lease ran out, as after a
freeze or a partition). As soon as the loss is known it raises ``LockLost`` inside the
body, the way Celery's prefork pool raises ``SoftTimeLimitExceeded``:

- a body on the process's main thread (prefork and solo pools, ``apply()``) gets a signal
  (``SIGNAL``, ``SIGUSR2``) whose handler raises it, so a blocking call (``time.sleep``, a
  socket read) is interrupted too; a handler that was there before is still called for
  signals that are not ours;
- a body on another thread (the threads pool) gets it as an asynchronous exception, raised
  at its next Python instruction (a blocking C call finishes first).

Once the body has returned, nothing is raised any more: the check runs in the body's own
thread (the signal handler) or is withdrawn before the run ends (the asynchronous one).
On every pool a body can also ask itself: ``current_lock().ensure_held()``.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any

from celery_singleton_lock.engine import RedisLock
from celery_singleton_lock.exceptions import LockLost, name_async_lock_lost
from celery_singleton_lock.modes.base import Mode

if TYPE_CHECKING:
    from celery_singleton_lock.modes.base import Run
    from celery_singleton_lock.options import LockOptions

__all__ = ["POLL_INTERVAL", "SIGNAL", "RaiseOnLost", "watching"]

log = logging.getLogger("celery_singleton_lock.task")

#: How often (seconds) the watcher looks at the watched locks' leases (a clock comparison
#: each, no round trip).
POLL_INTERVAL = 0.05
#: The signal that interrupts a body on the main thread.
SIGNAL = signal.SIGUSR2


@dataclass(eq=False)
class _Watched:
    lock: RedisLock
    thread: int
    armed: bool = True
    fired: bool = False


_guard = threading.Lock()
_watched: dict[int, _Watched] = {}  # by thread ident
_wake = threading.Event()
_watcher_pid = 0
_previous: Any = None


def _on_signal(signum: int, frame: FrameType | None) -> None:
    """Raise ``LockLost`` in the main thread's body when its lease is gone; a signal that
    is not ours goes to the handler that was there before."""
    # No lock here: the handler may run while this very thread holds it.
    watched = _watched.get(threading.get_ident())
    if watched is not None and watched.armed and watched.fired:
        raise LockLost("the lease of the lock was lost while the task ran", watched.lock.name)
    if callable(_previous):
        _previous(signum, frame)


def _install_handler() -> bool:
    """Install the signal handler (main thread only); whether it is in place."""
    global _previous  # noqa: PLW0603 - one handler per process
    if threading.current_thread() is not threading.main_thread():
        return False
    current = signal.getsignal(SIGNAL)
    if current is not _on_signal:
        try:
            signal.signal(SIGNAL, _on_signal)
        except (ValueError, OSError):  # not the main interpreter, or refused
            return False
        _previous = current
    return True


def _raise_in(thread: int, name: str) -> None:
    """Raise ``LockLost`` (naming lock ``name``) in another thread at its next instruction.

    CPython takes only the class here and instantiates it in that thread with no
    arguments; the name is left where ``LockLost.__init__`` finds it."""
    name_async_lock_lost(thread, name)
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), ctypes.py_object(LockLost))


def _withdraw(thread: int) -> None:
    """Withdraw an asynchronous exception not raised yet in ``thread``."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), None)
    name_async_lock_lost(thread, None)


def _fire(watched: _Watched) -> None:
    watched.fired = True
    log.error(
        "lock %s: lease lost while the task ran; raising LockLost in its body "
        "(lock_on_lost='raise')",
        watched.lock.name,
    )
    if watched.thread == threading.main_thread().ident:
        signal.pthread_kill(watched.thread, SIGNAL)
    else:
        _raise_in(watched.thread, watched.lock.name)


def _watch() -> None:
    while True:
        with _guard:
            for watched in _watched.values():
                if watched.armed and not watched.fired and watched.lock.lease_lost:
                    _fire(watched)
            idle = not _watched
        if idle:
            _wake.wait()
            _wake.clear()
        else:
            _wake.wait(POLL_INTERVAL)


def _ensure_watcher() -> None:
    global _watcher_pid  # noqa: PLW0603 - one watcher thread per process
    if _watcher_pid != os.getpid():  # first use, or a forked child: the thread is not here
        _watcher_pid = os.getpid()
        threading.Thread(target=_watch, name="csl-lost-watch", daemon=True).start()


@contextlib.contextmanager
def watching(lock: RedisLock, *, enabled: bool = True) -> Iterator[None]:
    """Within the block, ``LockLost`` is raised in the calling thread as soon as ``lock``'s
    lease is known lost (``enabled=False``: the block runs as it is)."""
    if not enabled:
        yield
        return
    thread = threading.get_ident()
    on_main = thread == threading.main_thread().ident
    if on_main and not _install_handler():
        log.warning("lock %s: cannot install the LockLost signal handler here", lock.name)
    watched = _Watched(lock, thread)
    with _guard:
        _ensure_watcher()
        _watched[thread] = watched
    _wake.set()
    try:
        yield
    finally:
        with _guard:
            watched.armed = False
            if _watched.get(thread) is watched:
                del _watched[thread]
            if watched.fired and not on_main:
                _withdraw(thread)


class RaiseOnLost(Mode):
    """``lock_on_lost="raise"``: the body is watched, and stopped with ``LockLost`` as soon
    as its lease is known lost."""

    name = "raise-on-lost"

    @classmethod
    def applies(cls, options: LockOptions) -> bool:
        return options.on_lost == "raise"

    def guard(self, run: Run) -> contextlib.AbstractContextManager[None]:
        return watching(run.lock)
