"""One background thread per process that extends the leases of auto-renewing locks.

A lock registers itself when acquired; the thread first extends it a third of a lease
later, so a short critical section costs no thread start and no extra round trip. The
renewer holds only weak references: a lock that is garbage collected without release
simply stops being renewed and expires. After ``fork`` the child starts its own thread.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
import weakref
from typing import Protocol

__all__ = ["Renewable", "renewer"]

log = logging.getLogger("celery_singleton_lock.renewer")


class Renewable(Protocol):
    """What the renewer needs from a lock."""

    def _renew_due(self, generation: int) -> float | None:
        """Extend the lease if ``generation`` is still current; the delay until the next
        renewal, or None to stop renewing."""

    def _renewing(self, generation: int) -> bool:
        """Whether the hold that scheduled ``generation`` is still being renewed."""


_Entry = tuple[float, int, "weakref.ref[Renewable]", int]


class _Renewer:
    """A min-heap of (due time, lock) served by one daemon thread."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[_Entry] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._pid = -1
        self._sleeping_until = float("inf")  # what the thread's current wait is aiming at

    def schedule(self, lock: Renewable, delay: float, generation: int) -> None:
        """Renew ``lock`` after ``delay`` seconds, for as long as ``generation`` is current."""
        due = time.monotonic() + delay
        with self._cond:
            if self._pid != os.getpid():  # forked: the parent's thread does not exist here
                self._heap.clear()
                self._thread = None
                self._pid = os.getpid()
            heapq.heappush(self._heap, (due, next(self._seq), weakref.ref(lock), generation))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="csl-lock-renewer", daemon=True
                )
                self._thread.start()
            elif due < self._sleeping_until:
                self._cond.notify()  # sooner than what the thread sleeps towards

    def _next(self) -> _Entry:
        with self._cond:
            while True:
                if self._heap:
                    wait = self._heap[0][0] - time.monotonic()
                    if wait <= 0:
                        # Something is due: first sweep out every entry whose hold already
                        # ended, so short holds cost this thread nothing but this sweep.
                        self._heap = [entry for entry in self._heap if not _dead(entry)]
                        heapq.heapify(self._heap)
                        if self._heap and self._heap[0][0] <= time.monotonic():
                            return heapq.heappop(self._heap)
                        continue
                    self._sleeping_until = self._heap[0][0]
                    self._cond.wait(wait)
                else:
                    self._sleeping_until = float("inf")
                    self._cond.wait()
                self._sleeping_until = float("-inf")  # awake: nobody needs to notify

    def _run(self) -> None:
        while True:
            _, _, ref, generation = self._next()
            lock = ref()
            if lock is None:
                continue
            try:
                delay = lock._renew_due(generation)
            except Exception:  # the thread must outlive any one lock's failure
                log.exception("lock renewal crashed")
                delay = None
            if delay is not None:
                self.schedule(lock, delay, generation)
            del lock


def _dead(entry: _Entry) -> bool:
    lock = entry[2]()
    return lock is None or not lock._renewing(entry[3])


renewer = _Renewer()
