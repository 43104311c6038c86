"""Issue gapless invoice numbers on real workers, then show a stale holder being fenced off.

    python -m examples.global_id.run [--tenants 3] [--invoices 20] [--workers 1]
                                     [--concurrency 4] [--db FILE] [--redis-url URL]

1. A burst of ``--invoices`` allocations per tenant, all sent at once: every tenant gets
   exactly 1..N, no gap, no duplicate, and the fencing tokens grow with the numbers.
2. A stalled holder: one allocation reads the next number and then freezes past its
   lease; the next allocation takes the expired lock with a larger token, claims the
   tenant and writes that number. When the stalled one wakes and writes, the database
   refuses it because its token is stale.

Exit status 0 when every check holds, 1 otherwise, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from examples._runtime import Stack, add_redis_url_option, guarded, redis_url_from


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line; ``--help`` documents every option."""
    parser = argparse.ArgumentParser(
        prog="python -m examples.global_id.run",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--tenants", type=int, default=3, help="tenants (1 to 26)")
    parser.add_argument("--invoices", type=int, default=20, help="invoices per tenant")
    parser.add_argument("--workers", type=int, default=1, help="celery worker processes")
    parser.add_argument("--concurrency", type=int, default=4, help="pool processes per worker")
    parser.add_argument("--db", help="new SQLite file to write and keep (default: a temporary one)")
    add_redis_url_option(parser, "broker, locks and results")
    parser.add_argument("--timeout", type=float, default=60, help="seconds per step")
    args = parser.parse_args(argv)
    if not 1 <= args.tenants <= 26 or args.invoices < 1 or args.workers < 1:
        parser.error("--tenants must be 1..26, --invoices and --workers at least 1")
    if args.db and Path(args.db).exists():
        parser.error(f"--db {args.db} exists: give a new file (the checks count from 1)")
    if args.concurrency < 2:
        parser.error("--concurrency must be at least 2 (the stalled holder occupies one)")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the example; return the exit status."""
    args = parse_args(argv)

    def body() -> int:
        with tempfile.TemporaryDirectory(prefix="global-id-") as tmp:
            db_path = Path(args.db).resolve() if args.db else Path(tmp, "invoices.sqlite3")
            return run(args, str(db_path))

    return guarded(body)


def _numbers(values: list[int]) -> str:
    if len(values) <= 12:
        return " ".join(map(str, values))
    return " ".join(map(str, values[:5])) + " … " + " ".join(map(str, values[-3:]))


def run(args: argparse.Namespace, db_path: str) -> int:
    """Start Redis and workers, run both steps, check the invoices table."""
    with Stack(redis_url_from(args), name="global-id") as stack:
        namespace = stack.namespace("global_id")
        stack.forget_on_close = [f"{namespace}:*"]
        env = {"GLOBAL_ID_NAMESPACE": namespace, "GLOBAL_ID_DB": db_path}
        os.environ.update(env, REDIS_URL=stack.url)
        from examples.global_id import tasks  # noqa: PLC0415 - after the env is set

        tasks.create_schema(db_path)
        print(f"invoices table: {db_path}")
        stack.workers(
            "examples.global_id.tasks", count=args.workers, concurrency=args.concurrency,
            queue=namespace, env=env,
        )  # fmt: skip
        tenants = [f"tenant-{chr(ord('a') + index)}" for index in range(args.tenants)]

        # 1. The burst: interleaved over tenants, all in flight at once.
        began = time.perf_counter()
        pending = [
            tasks.issue_invoice.delay(tenant, f"order-{tenant}-{index}")
            for index in range(args.invoices)
            for tenant in tenants
        ]
        burst = [_get(result, args.timeout) for result in pending]
        print(f"1. burst: {len(burst)} allocations in {time.perf_counter() - began:.2f} s")

        # 2. The stalled holder, then the allocation that takes over from it.
        tenant = tenants[0]
        db = tasks.connect(db_path)
        last_fence = tasks.claimed_fence(db, tenant)
        stalled = tasks.issue_invoice.delay(tenant, "order-stalled", stall=True)
        deadline = time.monotonic() + args.timeout
        while tasks.claimed_fence(db, tenant) == last_fence:  # until it holds the lock
            if time.monotonic() > deadline:
                raise TimeoutError("the stalled allocation never started")
            time.sleep(0.02)
        fresh = tasks.issue_invoice.delay(tenant, "order-after-stall")
        late, taken_over = _get(stalled, args.timeout), _get(fresh, args.timeout)
        rows = db.execute(
            "SELECT tenant, number, fence FROM invoices ORDER BY tenant, number"
        ).fetchall()
        db.close()
        return report(
            tenants,
            burst=burst,
            late=late,
            taken_over=taken_over,
            rows=rows,
            invoices=args.invoices,
        )


def _get(result: Any, timeout: float) -> dict[str, Any]:
    value: dict[str, Any] = result.get(timeout=timeout)
    result.forget()
    return value


def report(
    tenants: list[str],
    *,
    burst: list[dict[str, Any]],
    late: dict[str, Any],
    taken_over: dict[str, Any],
    rows: list[tuple[str, int, int]],
    invoices: int,
) -> int:
    """Print the numbers and the checks; 0 when all hold."""
    print(
        f"2. stalled holder: fence {late['fence']} read number {late['number']}, "
        f"froze {late['frozen']:.1f} s (past its lease); the next holder, fence "
        f"{taken_over['fence']}, wrote number {taken_over['number']}; the stalled write was "
        + ("REFUSED by the database" if not late["written"] else "ACCEPTED")
    )
    print("invoice numbers now in the table:")
    checks: list[tuple[str, bool]] = []
    for tenant in tenants:
        numbers = [number for name, number, _ in rows if name == tenant]
        fences = [fence for name, _, fence in rows if name == tenant]
        expected = invoices
        if tenant == tenants[0]:  # step 2 allocated for this tenant too
            expected += int(late["written"]) + int(taken_over["written"])
        print(f"   {tenant}: {_numbers(numbers)}")
        checks.append(
            (
                f"{tenant}: numbers are exactly 1..{expected}",
                numbers == list(range(1, expected + 1)),
            )
        )
        checks.append(
            (f"{tenant}: fencing tokens grow with the numbers", fences == sorted(set(fences)))
        )
    checks.append(("every allocation of the burst was written", all(r["written"] for r in burst)))
    checks.append(
        ("the next holder got a larger fencing token", taken_over["fence"] > late["fence"])
    )
    checks.append(("the stalled holder's late write was refused", not late["written"]))
    checks.append(("the next holder wrote the number", bool(taken_over["written"])))
    failed = [label for label, ok in checks if not ok]
    for label, ok in checks:
        print(f"   [{'ok' if ok else 'FAILED'}] {label}")
    print("all checks passed" if not failed else f"{len(failed)} check(s) FAILED")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
