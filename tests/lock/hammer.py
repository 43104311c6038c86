"""Many processes on one lock, with an overlap detector and a lost-update counter.

``run_hammer`` starts real OS processes that each take the lock repeatedly around a
deliberately non-atomic read-sleep-write; a correct lock gives zero overlaps and a counter
equal to the number of critical sections. ``BrokenLock`` is the control that must fail.
``client_factory`` (a picklable top-level callable ``url -> client``, default
``redis.Redis.from_url``) lets the same harness run on e.g. ``RedisCluster.from_url``.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from celery_singleton_lock import RedisLock


class BrokenLock(RedisLock):
    """A lock that never excludes anyone: the control case for the detectors."""

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        return True

    def release(self) -> None:
        return None


@dataclass
class HammerResult:
    """What the detectors saw."""

    overlaps: int
    counter: int
    expected: int
    fences_increasing: bool


ClientFactory = Callable[[str], Any]


def _worker(
    url: str, name: str, scripting: bool, iterations: int, broken: bool, out: Any,
    client_factory: ClientFactory | None = None,
) -> None:  # fmt: skip
    try:
        _critical_sections(url, name, scripting, iterations, broken, out, client_factory)
    except BaseException as exc:
        out.put(f"{type(exc).__name__}: {exc}")  # the parent raises it instead of waiting
        raise


def _critical_sections(
    url: str, name: str, scripting: bool, iterations: int, broken: bool, out: Any,
    client_factory: ClientFactory | None,
) -> None:  # fmt: skip
    client = (client_factory or redis.Redis.from_url)(url)
    cls = BrokenLock if broken else RedisLock
    lock = cls(client, name, timeout=10, scripting=scripting, fallback_poll=0.5)
    overlaps = 0
    fences: list[tuple[int, int]] = []
    for _ in range(iterations):
        if not lock.acquire(timeout=60):
            raise RuntimeError("acquire timed out")
        if client.incr(f"{name}:inside") != 1:
            overlaps += 1
        value = int(client.get(f"{name}:counter") or 0)
        time.sleep(0.0005)
        client.set(f"{name}:counter", value + 1)
        # Record (fence, counter value seen) to check fences follow the critical sections.
        fences.append((lock.fencing_token or 0, value))
        client.decr(f"{name}:inside")
        lock.release()
    out.put((overlaps, fences))


def run_hammer(
    url: str, name: str, *, scripting: bool, processes: int = 8, iterations: int = 25,
    broken: bool = False, client_factory: ClientFactory | None = None,
) -> HammerResult:  # fmt: skip
    """Run ``processes`` × ``iterations`` critical sections; every wait bounded.

    A worker that fails makes this raise RuntimeError with the worker's error."""
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [
        ctx.Process(
            target=_worker, args=(url, name, scripting, iterations, broken, out, client_factory)
        )
        for _ in range(processes)
    ]
    for proc in procs:
        proc.start()
    finished = False
    try:
        results: list[tuple[int, list[tuple[int, int]]]] = []
        for _ in procs:
            item = out.get(timeout=120)
            if isinstance(item, str):
                raise RuntimeError(f"hammer worker failed: {item}")
            results.append(item)
        finished = True
    finally:
        for proc in procs:
            proc.join(timeout=30 if finished else 0.5)  # after a failure: stop the rest now
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
    client = (client_factory or redis.Redis.from_url)(url)
    counter = int(client.get(f"{name}:counter") or 0)
    client.close()
    pairs = sorted(pair for _, fences in results for pair in fences)
    seen = [value for _, value in pairs]
    return HammerResult(
        overlaps=sum(overlaps for overlaps, _ in results),
        counter=counter,
        expected=processes * iterations,
        fences_increasing=seen == sorted(seen) and len(set(seen)) == len(seen),
    )
