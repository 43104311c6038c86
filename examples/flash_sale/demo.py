"""The flash-sale demo: the race without the lock, and the cure, on real Celery workers.

    python -m examples.flash_sale.demo [--orders 400] [--stock 50] [--skus 3]
                                       [--workers 2] [--concurrency 4] [--redis-url URL]

It uses the Redis at ``--redis-url`` (default: ``$REDIS_URL``) or, with neither, starts a
private redis-server of its own. It starts ``--workers`` real ``celery worker`` processes
(prefork) of :mod:`examples.flash_sale.tasks` and then sells the same stock twice: first
with ``buy_unlocked`` (a plain task: the read-modify-write of the stock races and oversells),
then with ``buy`` (a ``LockedTask`` keyed on the SKU: purchases of one SKU take turns, and
exactly the stock is sold). Each phase fires its orders concurrently, shows a progress bar,
and the run ends with a table of both.

Exit status: 0 when the locked phase sold exactly the stock with nothing failed or timed
out; 1 otherwise; 130 when interrupted. Every process it started is stopped on the way out,
including on Ctrl-C and SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from examples._runtime import Stack, add_redis_url_option, guarded, redis_url_from

if TYPE_CHECKING:
    from examples.flash_sale.producer import Tally

APP = "examples.flash_sale.tasks"


def _count(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    parse.__name__ = "int"
    return parse


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line; ``--help`` documents every option."""
    parser = argparse.ArgumentParser(
        prog="python -m examples.flash_sale.demo",
        description="Sell the same stock twice on real Celery workers: without a lock "
        "(it oversells) and with LockedTask(lock_keys=['sku'], lock_on_conflict='wait') "
        "(it sells exactly the stock). Exits 1 if the locked phase oversold or any order "
        "failed or timed out.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--orders", type=_count(1), default=400, help="orders per phase")
    parser.add_argument("--stock", type=_count(0), default=50, help="items in stock per SKU")
    parser.add_argument("--skus", type=_count(1), default=3, help="SKUs on sale")
    parser.add_argument("--workers", type=_count(1), default=2, help="celery worker processes")
    parser.add_argument(
        "--concurrency", type=_count(1), default=4, help="prefork pool processes per worker"
    )
    add_redis_url_option(parser, "broker, locks and data")
    parser.add_argument(
        "--timeout", type=_count(1), default=120, help="seconds a phase may take at most"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the demo; return the exit status."""
    args = parse_args(argv)
    console = Console(highlight=False)
    return guarded(lambda: run(args, console), say=lambda text: console.print(text, markup=False))


def run(args: argparse.Namespace, console: Console) -> int:
    """Start Redis (if needed) and the workers, run both phases, print the table."""
    console.print(
        f"[bold]Flash sale[/]: {args.orders} orders for {args.skus} SKU(s) × {args.stock} "
        f"in stock, on {args.workers} worker(s) × {args.concurrency} processes"
    )

    def echo(line: str) -> None:
        console.print(line, markup=False)

    with Stack(redis_url_from(args), name="flash-sale", echo=echo) as stack:
        namespace = stack.namespace("flash_sale")
        stack.forget_on_close = [f"{namespace}:*"]
        # The tasks module reads these when imported, here and in every worker.
        os.environ["REDIS_URL"] = stack.url
        os.environ["FLASH_SALE_NAMESPACE"] = namespace
        stack.workers(
            APP,
            count=args.workers,
            concurrency=args.concurrency,
            queue=namespace,
            env={"FLASH_SALE_NAMESPACE": namespace},
        )
        from examples.flash_sale import producer  # noqa: PLC0415 - after the env is set

        skus = producer.sku_names(args.skus)
        results = []
        columns = (
            TextColumn("{task.description:<28}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("orders"),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=console) as progress:
            for phase, task in producer.PHASES:
                label = "1. without lock" if phase == "unlocked" else "2. with LockedTask"
                bar = progress.add_task(label, total=args.orders)
                result = producer.run_phase(
                    phase,
                    task,
                    orders=args.orders,
                    stock=args.stock,
                    skus=skus,
                    timeout=args.timeout,
                    on_progress=_advance(progress, bar),
                )
                results.append(result)
                if result.timed_out:
                    break  # its leftovers would distort the next phase
    if len(results) < len(producer.PHASES):
        console.print(
            f"[bold red]FAILED[/]: phase 1 did not finish within {args.timeout} s "
            f"({results[0].done} of {args.orders} orders done)"
        )
        return 1
    unlocked, locked = results
    console.print(table(unlocked, locked))
    return verdict(unlocked, locked, console)


def _advance(progress: Progress, bar: TaskID) -> Callable[[int], None]:
    """A callback moving ``bar`` to the number of orders done."""

    def update(done: int) -> None:
        progress.update(bar, completed=done)

    return update


def _lock_time(result: Tally) -> str:
    if not result.lock_ms:
        return "-"
    return f"{statistics.median(result.lock_ms):.1f} / {max(result.lock_ms):.0f} ms"


def table(unlocked: Tally, locked: Tally) -> Table:
    """Both phases side by side."""
    out = Table(title="Flash sale: buy_unlocked, then buy", title_justify="left")
    out.add_column("")
    out.add_column("1. no lock", justify="right")
    out.add_column("2. LockedTask", justify="right")

    def oversold(result: Tally) -> str:
        text = str(result.oversold)
        return f"[bold red]{text}[/]" if result.oversold else f"[bold green]{text}[/]"

    rows: list[tuple[str, Callable[[Tally], str]]] = [
        ("orders sent", lambda r: f"{r.orders - len(r.send_errors)}"),
        ("sold", lambda r: f"{r.sold} of {r.stock}"),
        ("oversold", oversold),
        ("stock left (stock − sold)", lambda r: str(r.left)),
        ("stock counter in Redis", lambda r: str(r.counter_left)),
        ("overlapping checkouts", lambda r: str(r.overlaps)),
        ("lock waits (SKU found locked)", lambda r: f"{r.waits}" if r.lock_ms else "-"),
        ("time to lock, median / max", _lock_time),
        ("fencing tokens issued", lambda r: str(r.tokens) if r.tokens else "-"),
        ("failed / timed out", lambda r: f"{r.failed} / {'yes' if r.timed_out else 'no'}"),
        ("wall time", lambda r: f"{r.seconds:.2f} s"),
    ]
    for label, cell in rows:
        out.add_row(label, cell(unlocked), cell(locked))
    return out


def verdict(unlocked: Tally, locked: Tally, console: Console) -> int:
    """Explain the table in two sentences; 0 when the locked phase was right."""
    lost = unlocked.counter_left - unlocked.left
    if unlocked.oversold:
        console.print(
            f"Without the lock: sold {unlocked.sold} items of {unlocked.stock}, "
            f"[bold red]oversold {unlocked.oversold}[/]; {lost} decrements of the stock "
            "counter were lost to overlapping read-modify-writes."
        )
    elif unlocked.expected == unlocked.orders:
        console.print(
            "Without the lock: nothing to oversell (no more orders than stock per SKU), "
            f"yet {lost} decrements of the stock counter were lost. Use more orders."
        )
    else:
        console.print("Without the lock: no oversell this time (the race is timing-dependent).")
    problems = []
    if locked.oversold:
        problems.append(f"oversold {locked.oversold}")
    if locked.sold != locked.expected:
        problems.append(f"sold {locked.sold}, expected {locked.expected}")
    if locked.overlaps:
        problems.append(f"{locked.overlaps} overlapping checkouts")
    if not locked.fences_increasing:
        problems.append("fencing tokens out of order")
    for result in (unlocked, locked):
        if result.failed or result.send_errors:
            problems.append(f"{result.phase}: {result.failed + len(result.send_errors)} failed")
        if result.timed_out:
            problems.append(f"{result.phase}: timed out")
        for error in [*result.send_errors, *result.errors][:3]:
            console.print(f"  [red]{result.phase}: {error}[/]")
    if problems:
        console.print(f"[bold red]FAILED[/]: {'; '.join(problems)}")
        return 1
    console.print(
        f"With LockedTask: sold {locked.sold} of {locked.stock}, [bold green]oversold 0[/], "
        f"{locked.tokens} fencing tokens, strictly increasing per SKU."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
