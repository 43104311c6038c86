"""The README's quick start, run: a worker on ``shop.py``, six purchases of a stock of three.

    python -m examples.quickstart [--redis-url URL] [--buyers 6] [--stock 3]

Starts one ``celery worker`` (prefork, two pool processes) on ``examples/quickstart/shop.py``,
puts the stock in Redis, sends one ``buy`` per buyer and waits for every result. It checks
in code what the README says: exactly as many purchases sell as there is stock, each with
its own fencing token, and the stock ends at 0. It prints each purchase and the verdict.

Redis: ``--redis-url``, else ``$REDIS_URL``, else a private ``redis-server`` it starts and
stops (from ``PATH``, else the embedded server of the ``demo`` extra). On a Redis you give
it, it uses a queue and a SKU unique to the run and deletes the stock key at the end.

Exit status 0 when the checks hold, 1 when one fails (or Redis or a worker could not be
started), 130 when interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys

from examples._runtime import Stack, add_redis_url_option, guarded, redis_url_from


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line; ``--help`` documents every option."""
    parser = argparse.ArgumentParser(
        prog="python -m examples.quickstart",
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--buyers", type=int, default=6, help="purchases sent at once")
    parser.add_argument("--stock", type=int, default=3, help="items in stock")
    parser.add_argument("--timeout", type=float, default=60, help="seconds to wait for a result")
    add_redis_url_option(parser, "broker, locks, results and the stock")
    args = parser.parse_args(argv)
    if args.buyers < 1 or args.stock < 0:
        parser.error("--buyers must be at least 1 and --stock at least 0")
    return args


def run(args: argparse.Namespace) -> int:
    """Start Redis and a worker, sell, check; the exit status."""
    with Stack(redis_url_from(args), name="quickstart") as stack:
        namespace = stack.namespace("quickstart")
        sku = "sku-42" if stack.embedded else f"{namespace}:sku-42"
        stack.forget_on_close = [f"stock:{sku}"]
        os.environ["REDIS_URL"] = stack.url  # shop.py reads it at import
        from examples.quickstart import shop  # noqa: PLC0415 - after REDIS_URL is set

        stack.workers("examples.quickstart.shop", concurrency=2, queue=namespace)
        shop.store.set(f"stock:{sku}", args.stock)
        print(f"stock of {sku}: {args.stock}; {args.buyers} purchases sent at once")
        sent = [shop.buy.apply_async((sku, user), queue=namespace) for user in range(args.buyers)]
        sold = []
        for user, result in enumerate(sent):
            token = result.get(timeout=args.timeout)
            result.forget()
            print(f"  buyer {user}: " + ("sold out" if token is None else f"sold, fence {token}"))
            if token is not None:
                sold.append(token)
        left = int(shop.store.get(f"stock:{sku}") or 0)
        shop.store.close()
        expected = min(args.stock, args.buyers)
        checks = [
            (f"{expected} of {args.buyers} purchases sold", len(sold) == expected),
            ("each sale has its own fencing token", len(set(sold)) == len(sold)),
            (f"the stock ends at {args.stock - expected}", left == args.stock - expected),
        ]
        for label, ok in checks:
            print(f"  [{'ok' if ok else 'FAILED'}] {label}")
        failed = [label for label, ok in checks if not ok]
        print(
            f"{args.buyers} calls sold {len(sold)}: no oversell"
            if not failed
            else f"{len(failed)} check(s) FAILED"
        )
        return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    """Run the quick start; return the exit status."""
    args = parse_args(argv)
    return guarded(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
