"""What stacked limits cost an uncontended acquire + release, side by side in one run on a
private redis-server: our plain lock, our lock with a two-limit stack (a tenant and a global
budget, weight 2), our lock with three slots (``lock_limit=3``), and redis-py's ``Lock`` (which
has no limits: the floor of a Redis lock users pick). Prints the median and the 90th
percentile per cycle and the ratio of each median to our plain lock's.

    .venv/bin/python -m benchmarks.bench_stack [--cycles 3000]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import redis

from celery_singleton_lock import RedisLock
from celery_singleton_lock.engine.stack import Limit, Stack, stack_base
from celery_singleton_lock.testing import RedisServer

Cycle = Callable[[], None]


def _ours(lock: RedisLock) -> Cycle:
    def cycle() -> None:
        if not lock.acquire(blocking=False):
            raise RuntimeError("an uncontended acquire failed")
        lock.release()

    return cycle


def _redis_py(client: redis.Redis) -> Cycle:
    lock = client.lock("bench:redis-py", timeout=30)

    def cycle() -> None:
        if not lock.acquire(blocking=False):
            raise RuntimeError("an uncontended acquire failed")
        lock.release()

    return cycle


def measure(cycle: Cycle, cycles: int) -> list[float]:
    """Microseconds per acquire + release, one sample per cycle (after a warm-up)."""
    for _ in range(200):
        cycle()
    samples = []
    for _ in range(cycles):
        started = time.perf_counter()
        cycle()
        samples.append((time.perf_counter() - started) * 1e6)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=3000)
    args = parser.parse_args()
    with RedisServer() as server, redis.Redis.from_url(server.url) as client:
        stack = Stack(
            stack_base("bench"),
            (Limit("tenant:acme", "tenant:{tenant}", 5), Limit("global", "global", 50)),
            2,
        )
        contenders = {
            "RedisLock": _ours(RedisLock(client, "bench:plain", timeout=30)),
            "RedisLock + 2 stacked limits": _ours(
                RedisLock(client, "bench:job:{bench:stack}", timeout=30, stack=stack)
            ),
            "RedisLock(limit=3)": _ours(RedisLock(client, "bench:slots", timeout=30, limit=3)),
            "redis-py Lock": _redis_py(client),
        }
        results = {name: measure(cycle, args.cycles) for name, cycle in contenders.items()}
    base = statistics.median(results["RedisLock"])
    print(
        f"| acquire + release, uncontended ({args.cycles} cycles) | median µs | p90 µs | x plain |"
    )
    print("|---|---|---|---|")
    for name, samples in results.items():
        median = statistics.median(samples)
        p90 = statistics.quantiles(samples, n=10)[-1]
        print(f"| {name} | {median:.0f} | {p90:.0f} | {median / base:.2f} |")


if __name__ == "__main__":
    main()
