"""Fire a burst of orders at the flash-sale workers and count what was sold.

Run workers first (``celery -A examples.flash_sale.tasks worker``), then::

    python -m examples.flash_sale.producer --orders 400 --stock 50 --skus 3

It runs the sale twice on fresh stock, first with ``buy_unlocked`` and then with ``buy``
(the locked task), and prints one line per phase: sold, oversold, stock left. The demo
(``python -m examples.flash_sale.demo``) does the same with its own Redis and workers and
a live display; both share the functions below.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from threading import Event, Lock
from typing import Any

from kombu.utils.url import maybe_sanitize_url

from examples.flash_sale.celeryconfig import REDIS_URL
from examples.flash_sale.tasks import buy, buy_unlocked, key, store

#: The two phases, in the order they run: (phase name, task).
PHASES: tuple[tuple[str, Any], ...] = (("unlocked", buy_unlocked), ("locked", buy))


def sku_names(count: int) -> list[str]:
    """``sku-1`` … ``sku-<count>``."""
    return [f"sku-{index}" for index in range(1, count + 1)]


def restock(phase: str, skus: list[str], stock: int) -> None:
    """Start a phase afresh: every counter cleared, ``stock`` items of each SKU."""
    r = store()
    stale = list(r.scan_iter(match=key(phase, "*"), count=500))
    pipe = r.pipeline()
    if stale:
        pipe.delete(*stale)
    for sku in skus:
        pipe.set(key(phase, "stock", sku), stock)
    pipe.execute()


def place_orders(
    task: Any, skus: list[str], orders: int, threads: int = 16, stop: Event | None = None
) -> list[str]:
    """Send ``orders`` purchases round-robin over ``skus`` from ``threads`` concurrent
    senders; return the errors of sends that failed (normally none). Setting ``stop``
    ends the burst after the sends in flight."""
    errors: list[str] = []
    next_id = itertools.count()
    guard = Lock()
    stop = stop or Event()

    def sender() -> None:
        while not stop.is_set():
            with guard:
                order_id = next(next_id)
            if order_id >= orders:
                return
            try:
                task.delay(skus[order_id % len(skus)], order_id)
            except Exception as exc:  # noqa: BLE001 - reported with the phase's results
                errors.append(f"order {order_id} not sent: {exc}")

    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="order") as pool:
        for _ in range(threads):
            pool.submit(sender)
    return errors


def finished(phase: str) -> int:
    """How many orders of ``phase`` the workers have finished, successfully or not."""
    return int(store().get(key(phase, "done")) or 0)


def wait_until_done(
    phase: str, orders: int, timeout: float, on_progress: Callable[[int], None] | None = None
) -> bool:
    """Wait (at most ``timeout`` s) until the workers finished ``orders`` orders."""
    deadline = time.monotonic() + timeout
    while True:
        done = finished(phase)
        if on_progress is not None:
            on_progress(done)
        if done >= orders:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


@dataclass
class Tally:
    """The outcome of one phase, read back from Redis."""

    phase: str
    orders: int
    stock: int  # items in stock at the start, all SKUs together
    expected: int  # what a correct shop sells: per SKU, min(orders for it, its stock)
    done: int  # orders the workers finished, successfully or not
    sold: int
    counter_left: int  # what the stock counters say at the end (lost updates show here)
    overlaps: int
    failed: int
    errors: list[str]
    waits: int  # orders that found their SKU locked when they started
    lock_ms: list[float]  # per order: ms from the task's start until it held its lock
    fences: dict[str, list[int]]
    seconds: float = 0.0
    send_errors: list[str] = field(default_factory=list)
    timed_out: bool = False

    @property
    def oversold(self) -> int:
        """Items sold beyond the stock."""
        return max(0, self.sold - self.stock)

    @property
    def left(self) -> int:
        """Stock minus items sold: negative means sold items that do not exist."""
        return self.stock - self.sold

    @property
    def tokens(self) -> int:
        """Fencing tokens issued (one per lock acquisition)."""
        return sum(len(tokens) for tokens in self.fences.values())

    @property
    def fences_increasing(self) -> bool:
        """Whether, per SKU, each checkout held a larger token than the one before it."""
        return all(all(a < b for a, b in itertools.pairwise(t)) for t in self.fences.values())

    @property
    def correct(self) -> bool:
        """Sold exactly what it should, nothing overlapped, nothing failed or timed out."""
        return (
            self.sold == self.expected
            and self.overlaps == 0
            and self.failed == 0
            and not self.send_errors
            and not self.timed_out
            and self.fences_increasing
        )


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def tally(phase: str, skus: list[str], stock: int, orders: int) -> Tally:
    """Read a phase's numbers back from Redis."""
    r = store()
    per_sku = [len(range(index, orders, len(skus))) for index in range(len(skus))]
    return Tally(
        phase=phase,
        orders=orders,
        stock=stock * len(skus),
        expected=sum(min(count, stock) for count in per_sku),
        done=int(r.get(key(phase, "done")) or 0),
        sold=sum(int(r.get(key(phase, "sold", sku)) or 0) for sku in skus),
        counter_left=sum(int(r.get(key(phase, "stock", sku)) or 0) for sku in skus),
        overlaps=int(r.get(key(phase, "overlaps")) or 0),
        failed=int(r.get(key(phase, "failed")) or 0),
        errors=[_text(e) for e in r.lrange(key(phase, "errors"), 0, -1)],
        waits=int(r.get(key(phase, "waits")) or 0),
        lock_ms=[float(ms) for ms in r.lrange(key(phase, "lock_ms"), 0, -1)],
        fences={sku: [int(t) for t in r.lrange(key(phase, "fences", sku), 0, -1)] for sku in skus},
    )


def run_phase(
    phase: str,
    task: Any,
    *,
    orders: int,
    stock: int,
    skus: list[str],
    timeout: float,
    on_progress: Callable[[int], None] | None = None,
) -> Tally:
    """Restock, fire the orders concurrently, wait for the workers, tally."""
    restock(phase, skus, stock)
    started = time.perf_counter()
    stop = Event()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="burst") as sender:
        sending = sender.submit(place_orders, task, skus, orders, stop=stop)
        try:
            done = wait_until_done(phase, orders, timeout, on_progress)
            send_errors = sending.result(timeout=max(1.0, timeout))
        finally:
            stop.set()  # interrupted or timed out: stop sending what is left
    result = tally(phase, skus, stock, orders)
    result.seconds = time.perf_counter() - started
    result.send_errors = send_errors
    result.timed_out = not done
    return result


def main(argv: list[str] | None = None) -> int:
    """Both phases with plain output; exit status 1 if the locked phase went wrong."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--orders", type=int, default=400, help="orders per phase (400)")
    parser.add_argument("--stock", type=int, default=50, help="items in stock per SKU (50)")
    parser.add_argument("--skus", type=int, default=3, help="number of SKUs on sale (3)")
    parser.add_argument("--timeout", type=float, default=120, help="seconds per phase (120)")
    args = parser.parse_args(argv)
    skus = sku_names(args.skus)
    print(f"broker {maybe_sanitize_url(REDIS_URL)}: ", end="")
    print(f"{args.orders} orders for {args.skus} SKU(s) × {args.stock} in stock")
    ok = True
    for phase, task in PHASES:
        result = run_phase(
            phase, task, orders=args.orders, stock=args.stock, skus=skus, timeout=args.timeout
        )
        print(
            f"{task.name}: sold {result.sold} of {result.stock} in stock, "
            f"oversold {result.oversold}, stock left {result.left}, "
            f"failed {result.failed}, {result.seconds:.1f} s"
            + (" - TIMED OUT" if result.timed_out else "")
        )
        if phase == "locked":
            ok = result.correct
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
