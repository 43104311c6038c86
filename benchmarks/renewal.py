"""What lease renewal costs one process: N auto-renewed leases held for a while.

    .venv/bin/python -m benchmarks.renewal --locks 10000 --lease 3 --seconds 10

Starts a private redis-server, takes N locks with ``auto_renew=True`` on one client, holds
them, and prints the renewals the server ran per second (against the N / (lease / 3)
needed), the client process's CPU per renewal and how many leases were lost. Reports,
never asserts.
"""

from __future__ import annotations

import argparse
import resource
import time

import redis

from celery_singleton_lock import RedisLock
from celery_singleton_lock.testing import RedisServer


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _evalsha_calls(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def main() -> None:
    """Parse the options, hold the locks, print one line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--locks", type=int, default=10_000)
    parser.add_argument("--lease", type=float, default=3.0, help="seconds")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long to hold them")
    options = parser.parse_args()
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url, socket_timeout=10)
        locks = [
            RedisLock(client, f"renewal:{n}", timeout=options.lease, auto_renew=True)
            for n in range(options.locks)
        ]
        for lock in locks:
            lock.acquire(blocking=False)
        cpu, calls = _cpu(), _evalsha_calls(client)
        time.sleep(options.seconds)
        cpu, calls = _cpu() - cpu, _evalsha_calls(client) - calls
        lost = sum(lock.lease_lost for lock in locks)
        needed = options.locks / (options.lease / 3)
        print(
            f"{options.locks:,} leases of {options.lease:g} s held {options.seconds:g} s: "
            f"{calls / options.seconds:,.0f} renewals/s (needed {needed:,.0f}/s), "
            f"{1e6 * cpu / max(calls, 1):.0f} µs client CPU per renewal "
            f"({100 * cpu / options.seconds:.0f} % of a core), {lost} lost"
        )
        for lock in locks:
            if not lock.lease_lost:
                lock.release()
        client.close()


if __name__ == "__main__":
    main()
