"""Faults injected while five processes contend for one lock, in both protocols: the server
stopped (SIGSTOP) for longer than a lease, connections stalled and cut by a TCP proxy, a
client whose wall clock is an hour off, and a restart that loses every key.

Each hold is recorded as a window in CLOCK_MONOTONIC (one clock for every process of the
host): from the moment ``acquire`` returned to the moment the holder stopped trusting it
(it saw ``lease_lost``, or it was done and called ``release``). The checks:

* no two windows overlap while the server kept its data;
* fencing tokens grow in the order the holds began;
* a read-increment-write counter kept outside Redis loses no update;
* every hold that another hold overlapped reported the loss (``lease_lost`` during the
  work, ``LockNotOwned`` or an error at release): none is lost silently.

Each test prints its counts (run with ``-s`` to see them).
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import pytest
import redis

from celery_singleton_lock import LockError, LockNotOwned, RedisLock
from celery_singleton_lock.testing import FaultProxy, RedisServer

LEASE = 1.0
NAME = "faults:{counter}"


@dataclass(frozen=True)
class Role:
    """One contending process: how it reaches the server and how it behaves."""

    via_proxy: bool
    scripting: bool
    long: bool = False  # holds 1.5-2.5 s (renewed) instead of a few ms
    skew: float = 0.0  # seconds added to this process's wall clock


ROLES = (
    Role(via_proxy=True, scripting=True, long=True),
    Role(via_proxy=False, scripting=True),
    Role(via_proxy=False, scripting=False),
    Role(via_proxy=False, scripting=True, skew=3600.0),
    Role(via_proxy=True, scripting=False),
)


@dataclass(frozen=True)
class Window:
    """One hold as its holder saw it."""

    start: float  # acquire returned
    trusted_until: float  # lease_lost seen, or release called
    released_at: float  # release called
    fence: int
    wrote: bool  # did the counter increment
    saw_lost: bool  # lease_lost seen during the work
    release: str  # "released", "not owned" or "error"
    pid: int

    @property
    def reported(self) -> bool:
        return self.saw_lost or self.release != "released"


def _contend(
    role: Role, url: str, stop_at: float, counter: Any, out: Any, holder_info: str
) -> None:
    """One process's loop: acquire, work while checking the lease, increment, release."""
    if role.skew:
        real_time = time.time
        time.time = lambda: real_time() + role.skew  # this process's wall clock is off
    # The long holder's calls may hang longer than any stall, so only the clock can tell it
    # that its lease ran out; the others give up on a call after half a second.
    patience = 5.0 if role.long else 0.5
    client = redis.Redis.from_url(url, socket_timeout=patience, socket_connect_timeout=0.5)
    lock = RedisLock(
        client, NAME, timeout=LEASE, auto_renew=True, fallback_poll=0.2,
        scripting=role.scripting, holder_info=holder_info,
    )  # fmt: skip
    rng = random.Random(os.getpid())
    windows: list[Window] = []
    errors: Counter[str] = Counter()
    while time.monotonic() < stop_at:
        try:
            if not lock.acquire(timeout=1.0):
                continue
        except LockError as exc:
            errors[f"acquire {type(exc).__name__}"] += 1
            time.sleep(0.05)
            continue
        start = time.monotonic()
        fence = lock.fencing_token or 0
        seen = counter.value
        until = start + (rng.uniform(1.5, 2.5) if role.long else rng.uniform(0.0, 0.01))
        lost_at: float | None = None
        while time.monotonic() < until:
            if lock.lease_lost:
                # Trust ended when lease_lost turned True: the hold's deadline, which the
                # 2 ms polling here may notice a little later.
                hold = lock._hold()
                deadline = hold.expires_at if hold is not None and not hold.lost else math.inf
                lost_at = min(time.monotonic(), deadline)
                break
            time.sleep(0.002)
        wrote = lost_at is None and not lock.lease_lost
        if wrote:
            counter.value = seen + 1
        ended = time.monotonic()
        outcome = "released"
        try:
            lock.release()
        except LockNotOwned:
            outcome = "not owned"
        except LockError as exc:
            outcome = "error"
            errors[f"release {type(exc).__name__}"] += 1
        windows.append(
            Window(start, lost_at or ended, ended, fence, wrote, lost_at is not None, outcome,
                   os.getpid())
        )  # fmt: skip
        if role.long:
            time.sleep(1.0)  # leave the short holders room between long holds
    out.put(([asdict(window) for window in windows], dict(errors)))


def _holder_role(client: redis.Redis) -> str | None:
    raw = client.get(NAME)
    if raw is None:
        return None
    return "long" if b'"long"' in raw else "short"


def _run(
    server: RedisServer,
    proxy: FaultProxy,
    seconds: float,
    faults: list[tuple[float, str, Callable[[], object]]],
) -> dict[str, Any]:
    """Run the contenders for ``seconds`` while ``faults`` fire at their offsets; return
    the windows, errors and fault log."""
    ctx = multiprocessing.get_context("fork")
    counter = ctx.RawValue("q", 0)
    out = ctx.Queue()
    stop_at = time.monotonic() + seconds
    processes = []
    for role in ROLES:
        url = proxy.url if role.via_proxy else server.url
        info = json.dumps({"role": "long" if role.long else "short"})
        args = (role, url, stop_at, counter, out, info)
        processes.append(ctx.Process(target=_contend, args=args))
    for process in processes:
        process.start()
    began = time.monotonic()
    fault_log: list[tuple[float, str]] = []
    try:
        for offset, label, action in faults:
            time.sleep(max(0.0, began + offset - time.monotonic()))
            action()
            fault_log.append((round(time.monotonic() - began, 2), label))
        results = [out.get(timeout=seconds + 15) for _ in processes]
    finally:
        proxy.resume()
        for process in processes:
            process.join(10)
            if process.is_alive():
                process.kill()
    windows = [Window(**item) for records, _ in results for item in records]
    errors: Counter[str] = Counter()
    for _, counts in results:
        errors.update(counts)
    return {
        "windows": windows,
        "errors": dict(errors),
        "faults": fault_log,
        "counter": counter.value,
    }


def _check(windows: list[Window]) -> dict[str, Any]:
    """Overlaps of trusted windows, unreported losses, fencing order."""
    ordered = sorted(windows, key=lambda window: window.start)
    overlaps, unreported, fence_backwards = [], [], []
    latest: Window | None = None  # the earlier window that is trusted the longest
    reaching: Window | None = None  # the earlier window whose holder kept it the longest
    for window in ordered:
        if latest is not None and window.start < latest.trusted_until:
            overlaps.append((latest, window))
        elif latest is not None and window.fence <= latest.fence:
            fence_backwards.append((latest, window))
        if reaching is not None and window.start < reaching.released_at and not reaching.reported:
            unreported.append((reaching, window))
        if latest is None or window.trusted_until > latest.trusted_until:
            latest = window
        if reaching is None or window.released_at > reaching.released_at:
            reaching = window
    return {
        "holds": len(windows),
        "overlaps": len(overlaps),
        "unreported_losses": len(unreported),
        "fence_backwards": len(fence_backwards),
        "reported_losses": sum(window.reported for window in windows),
        "writes": sum(window.wrote for window in windows),
        "pids": len({window.pid for window in windows}),
        "per_pid": Counter(window.pid for window in windows),
        "examples": [(asdict(a), asdict(b)) for a, b in (overlaps + unreported)[:3]],
    }


def _wait_for_long_holder(client: redis.Redis) -> None:
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline and _holder_role(client) != "long":
        time.sleep(0.01)


@pytest.mark.slow
def test_faults_that_keep_the_data_never_break_exclusion() -> None:
    """While the long holder holds the lock: its connection stalled 2 s (past the lease,
    rivals reaching the server directly), then the server SIGSTOPped 1.5 s; later a 0.4 s
    SIGSTOP, a 0.3 s stall and two connection cuts; one client's clock an hour off. No two
    holds overlap, no update is lost, fencing tokens grow, every lost lease is reported."""
    with RedisServer() as server, FaultProxy(server.port) as proxy:
        watcher = redis.Redis.from_url(server.url, socket_timeout=5)

        def when_long_holds(action: Callable[[], object]) -> Callable[[], object]:
            return lambda: (_wait_for_long_holder(watcher), action())

        faults: list[tuple[float, str, Callable[[], object]]] = [
            (1.0, "proxy stall (long holder holding)", when_long_holds(proxy.stall)),
            (3.0, "proxy resume", proxy.resume),
            (4.5, "SIGSTOP server (long holder holding)", when_long_holds(server.pause)),
            (6.0, "SIGCONT server", server.resume),
            (7.5, "proxy cut", proxy.cut),
            (9.5, "SIGSTOP server (0.4 s, under a lease)", server.pause),
            (9.9, "SIGCONT server", server.resume),
            (11.0, "proxy stall (0.3 s)", proxy.stall),
            (11.3, "proxy resume", proxy.resume),
            (12.5, "proxy cut", proxy.cut),
        ]
        run = _run(server, proxy, 14.0, faults)
        watcher.close()
    report = _check(run["windows"])
    report.update(errors=run["errors"], faults=run["faults"], counter=run["counter"])
    print("\nfaults that keep the data:", json.dumps(report, indent=1, default=str))
    assert report["holds"] >= 50
    assert report["pids"] == len(ROLES)
    assert report["overlaps"] == 0
    assert report["unreported_losses"] == 0
    assert report["fence_backwards"] == 0
    assert run["counter"] == report["writes"]
    assert report["reported_losses"] >= 2  # the long holder's lease ran out twice


@pytest.mark.slow
def test_a_restart_that_loses_every_key_is_reported() -> None:
    """The server restarts empty while the long holder holds it: holds may overlap then
    (the lock itself is gone), but fencing tokens still grow and every holder whose lock
    vanished learns it (lease_lost, LockNotOwned or an error)."""
    with RedisServer() as server, FaultProxy(server.port) as proxy:
        watcher = redis.Redis.from_url(server.url, socket_timeout=5)

        def restart_while_long_holds() -> None:
            _wait_for_long_holder(watcher)
            server.restart()

        faults: list[tuple[float, str, Callable[[], object]]] = [
            (1.0, "restart server empty (long holder holding)", restart_while_long_holds),
            (5.0, "restart server empty", server.restart),
        ]
        run = _run(server, proxy, 8.0, faults)
        watcher.close()
    report = _check(run["windows"])
    report.update(errors=run["errors"], faults=run["faults"], counter=run["counter"])
    print("\nrestart with data loss:", json.dumps(report, indent=1, default=str))
    assert report["holds"] >= 30
    assert report["unreported_losses"] == 0
    assert report["fence_backwards"] == 0
