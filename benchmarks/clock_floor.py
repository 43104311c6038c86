"""Where the uncontended floor is for a lock that reads the server's clock: scenario A of
:mod:`benchmarks.bench_lock` with ours, the ``SET NX PX`` floor, and ``floor+clock``, the
least an acquire that reads the Redis clock in one round trip can do (a Lua ``TIME`` +
``SET NX PX``; the release a Lua ``GET`` + compare + ``DEL``). Run ``python -m
benchmarks.clock_floor [--runs N]``; it prints the median pair, client CPU and server CPU
of each (medians over runs) and our ratio to both floors. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence

import redis

from benchmarks import bench_lock
from benchmarks.contenders import CONTENDERS, Contender, FloorLock

#: The acquire: the server's clock, then ``SET NX PX`` of a value that carries the expiry.
CLOCK_ACQUIRE = """
local t = redis.call('TIME')
local ms = t[1] * 1000 + math.floor(t[2] / 1000)
return redis.call('SET', KEYS[1], ARGV[1] .. ':' .. (ms + ARGV[2]), 'NX', 'PX', ARGV[2])
"""
#: The release: delete the key only when its value starts with our token.
CLOCK_RELEASE = """
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, string.len(ARGV[1])) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class ClockFloorLock(FloorLock):
    """``floor+clock``: one script each way, with nothing else (no waiting, no fencing)."""

    RELEASE = CLOCK_RELEASE

    def __init__(self, client: redis.Redis, key: str, lease: float) -> None:
        super().__init__(client, key, lease)
        self._acquire = client.register_script(CLOCK_ACQUIRE)

    def _take(self, token: str) -> bool:
        return bool(self._acquire(keys=[self._key], args=[token, self._px], client=self._client))


CLOCK_FLOOR = Contender(
    "floor+clock",
    ClockFloorLock,
    "redis",
    "redis",
    "Lua TIME + SET NX PX, Lua GET + compare + DEL",
    heavy=True,
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3, help="runs (default 3)")
    args = parser.parse_args(argv)
    params = bench_lock.Params.build(False, args.runs, None)
    chosen = [CONTENDERS["csl"], CONTENDERS["floor"], CLOCK_FLOOR]
    found: dict[str, list[bench_lock.Result]] = {c.name: [] for c in chosen}
    for run in range(args.runs):
        for name, result in bench_lock.scenario_a(chosen, params, run).items():
            found[name].append(result)
    medians = {}
    print("| lock | median pair µs | client CPU µs/pair | server CPU µs/pair |")
    print("|---|---|---|---|")
    for name, results in found.items():
        figures = [
            statistics.median(float(r[field]) for r in results)
            for field in ("median_us", "client_cpu_us", "server_cpu_us")
        ]
        medians[name] = figures[0]
        print(f"| {name} | {figures[0]:.1f} | {figures[1]:.1f} | {figures[2]:.1f} |")
    ours = medians["csl"]
    print(
        f"\nours / floor: {ours / medians['floor']:.2f}x; "
        f"ours / floor+clock: {ours / medians['floor+clock']:.2f}x"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
