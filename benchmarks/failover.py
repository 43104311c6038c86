"""Failover benchmark: how often a Sentinel failover breaks exclusion, and what
``RedisLock(replicas=1)`` (Redis ``WAIT 1`` after each acquire and renewal) and fencing
tokens change.

Run ``python -m benchmarks.failover [--trials N] [--json PATH]``.

Each trial starts a fresh :class:`~benchmarks.sentinel.SentinelGroup` on loopback (a
master, one replica, three Sentinels, ``down-after-milliseconds 1000``) and, through the
package's own ``sentinel://`` client, runs one holder thread per key (8 keys): acquire
without waiting, hold 1-20 ms, release, pause 0-20 ms, again. At a random instant the
master is killed; each holder holding then keeps holding (auto-renewed 5 s lease) for 6 s,
checking ``lease_lost``. Once the Sentinels have promoted the replica (and a new replica is started
for the new master, as an operator or an orchestrator would), a rival per key tries to
take the lock. Exclusion is **broken** for a key when a rival got its lock while the holder
from before the failover still believed it held it (``lease_lost`` False).

Three ways to lose the master: its process crashes (SIGKILL on loopback: what it already
wrote to its sockets still reaches the replica); its host crashes with a 1 ms link to the
replica (a LAN: the master is SIGKILLed and the replication bytes still on their way are
thrown away); its host crashes while the replica is a second behind (the link stalled for a
second first). Fencing: for every broken key the rival writes
first, then the stale holder, to a resource that refuses a token lower than the highest it
has accepted; the report counts the stale writes it refused.

Results are printed as a markdown table; nothing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import random
import signal
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import redis

from benchmarks.sentinel import SentinelGroup
from celery_singleton_lock import LockError, RedisLock
from celery_singleton_lock.client import client_from_url
from celery_singleton_lock.testing import RedisServer

__all__ = ["Trial", "main", "run_trial"]

KEYS = 8
LEASE = 5.0
HOLD_ACROSS = 6.0  # how long a holder at the kill keeps holding
RIVAL_PATIENCE = 12.0  # how long rivals try after the failover
#: The scenarios: how the master dies, and what happens to replication bytes in flight.
#: (link delay in seconds or None for plain loopback, stalled first, in-flight bytes lost)
SCENARIOS: dict[str, tuple[float | None, bool, bool]] = {
    "process crash (loopback)": (None, False, False),
    "host crash, 1 ms link": (0.001, False, True),
    "host crash, replica 1 s behind": (0.0, True, True),
}


@dataclass
class Hold:
    """One hold, as its holder saw it."""

    key: str
    token: int  # its fencing token
    acquired: float
    across: bool = False  # held when the master was killed
    lost_at: float | None = None  # lease_lost first seen
    ended: float | None = None


@dataclass
class Trial:
    """What one failover did."""

    scenario: str
    replicas: int
    holds_at_kill: int = 0
    holds_lost: int = 0  # the new master does not have the lock a holder from before holds
    broken: int = 0  # a rival held a key while its holder from before still believed it
    holders_told: int = 0  # of the broken: holders that saw lease_lost afterwards
    stale_writes_refused: int = 0  # by the fenced resource, of the broken keys' holders
    stale_writes_accepted: int = 0
    acquires_refused: int = 0  # LockBackendError at acquire (replicas did not acknowledge)
    failover_s: float = 0.0
    free_keys_back_s: list[float] = field(default_factory=list)  # keys no one held across


class Holder(threading.Thread):
    """Acquire, hold a few ms, release, pause a few ms, on one key; whoever holds at the
    kill holds on across it."""

    def __init__(self, url: str, key: str, replicas: int, kill: threading.Event, seed: int) -> None:
        super().__init__(daemon=True, name=f"holder-{key}")
        self.key = key
        self.kill = kill
        self.stop = threading.Event()
        self.client = client_from_url(url)
        self.replicas = replicas
        self.rng = random.Random(seed)
        self.holds: list[Hold] = []
        self.refused = 0
        self.current: Hold | None = None

    def run(self) -> None:
        while not self.stop.is_set() and not self.kill.is_set():
            lock = RedisLock(
                self.client, self.key, timeout=LEASE, auto_renew=True, replicas=self.replicas
            )
            try:
                acquired = lock.acquire(blocking=False)
            except LockError:
                self.refused += 1
                acquired = False
            if not acquired:
                time.sleep(0.005)
                continue
            hold = Hold(self.key, lock.fencing_token or 0, time.monotonic())
            self.current = hold
            time.sleep(self.rng.uniform(0.001, 0.02))
            if self.kill.is_set():
                hold.across = True
                until = time.monotonic() + HOLD_ACROSS
                while time.monotonic() < until and not self.stop.is_set():
                    if hold.lost_at is None and lock.lease_lost:
                        hold.lost_at = time.monotonic()
                    time.sleep(0.005)
            hold.ended = time.monotonic()
            self.holds.append(hold)
            self.current = None
            with contextlib.suppress(LockError):  # lost, or the master is gone
                lock.release()
            time.sleep(self.rng.uniform(0.0, 0.02))


def run_trial(scenario: str, replicas: int, rng: random.Random) -> Trial:
    """One failover (see the module docstring)."""
    delay, stall, lose_in_flight = SCENARIOS[scenario]
    result = Trial(scenario, replicas)
    with SentinelGroup(link_delay=delay, stallable=stall) as group:
        kill = threading.Event()
        holders = [
            Holder(group.url, f"fo:{index}", replicas, kill, rng.randrange(2**32))
            for index in range(KEYS)
        ]
        for holder in holders:
            holder.start()
        time.sleep(rng.uniform(1.0, 2.0))
        if stall:
            group.links[0].stall()
            time.sleep(1.0)
        kill.set()
        old = group.kill_master()
        killed_at = time.monotonic()
        if lose_in_flight:
            group.links[0].cut()  # the host is gone: what was on its way is lost
            group.links[0].resume()
        time.sleep(0.05)  # every holder has looked at the kill since (holds last <= 20 ms)
        across = {h.key: h for h in (holder.current for holder in holders) if h and h.across}
        result.holds_at_kill = len(across)
        new = group.wait_failover(old)
        result.failover_s = round(time.monotonic() - killed_at, 2)
        with redis.Redis(port=new, socket_timeout=5) as promoted:
            for key, held in across.items():
                value = promoted.get(key) or b""
                if f":{held.token}:".encode() not in value:  # the fencing-token field
                    result.holds_lost += 1
        # A replica for the new master, as an orchestrator would start (WAIT 1 needs one).
        revived = RedisServer(port=old, extra_args=("--replicaof", "127.0.0.1", str(new)))
        group.nodes[old] = revived.start()
        rivals = client_from_url(group.url)
        deadline = time.monotonic() + RIVAL_PATIENCE
        pending = {holder.key for holder in holders}
        broken: set[str] = set()
        while pending and time.monotonic() < deadline:
            for key in sorted(pending):
                rival = RedisLock(rivals, key, timeout=LEASE, replicas=replicas)
                try:
                    got = rival.acquire(blocking=False)
                except LockError:
                    continue
                if not got:
                    continue
                pending.discard(key)
                now = time.monotonic()
                before = across.get(key)
                if before is None:
                    result.free_keys_back_s.append(round(now - killed_at, 2))
                elif (before.lost_at is None or before.lost_at > now) and (
                    before.ended is None or before.ended > now
                ):
                    broken.add(key)  # the holder from before still believes it holds
                    # A fenced resource: the rival writes first, then the stale holder.
                    if before.token > (rival.fencing_token or 0):
                        result.stale_writes_accepted += 1
                    else:
                        result.stale_writes_refused += 1
                with contextlib.suppress(LockError):
                    rival.release()
            time.sleep(0.02)
        for holder in holders:
            holder.join(HOLD_ACROSS + 5)
            holder.stop.set()
        result.broken = len(broken)
        result.holders_told = sum(1 for key in broken if across[key].lost_at is not None)
        result.acquires_refused = sum(holder.refused for holder in holders)
    return result


def table(trials: Sequence[Trial]) -> str:
    """The trials as a markdown table, one row per setting (docs/deployment.md shows it,
    generated from docs/soak/failover.json by ``make docs-gen``)."""
    lines = [
        "| master lost by | `replicas` | failovers | holds across the failover | of them "
        "lost by it | exclusion broken (a rival got in) | failovers that broke it | their "
        "holders told (`lease_lost`) | stale writes refused by fencing | acquires refused "
        "(WAIT) | failover, median s | a free key usable again, median s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[str, int], list[Trial]] = {}
    for trial in trials:
        groups.setdefault((trial.scenario, trial.replicas), []).append(trial)
    for (scenario, replicas), rows in groups.items():
        broken = sum(row.broken for row in rows)
        free = [value for row in rows for value in row.free_keys_back_s]
        back = f"{statistics.median(free):.1f}" if free else "—"
        refused = sum(row.stale_writes_refused for row in rows)
        accepted = sum(row.stale_writes_accepted for row in rows)
        lines.append(
            f"| {scenario} | {replicas} | {len(rows)} | {sum(r.holds_at_kill for r in rows)} | "
            f"{sum(r.holds_lost for r in rows)} | "
            f"{broken} | {sum(1 for r in rows if r.broken)} of {len(rows)} | "
            f"{sum(r.holders_told for r in rows if r.broken)} of {broken} | "
            f"{refused} of {refused + accepted} | {sum(r.acquires_refused for r in rows)} | "
            f"{statistics.median(r.failover_s for r in rows):.1f} | {back} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.failover", description=__doc__)
    parser.add_argument("--trials", type=int, default=5, help="failovers per setting")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", help="write every trial here")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    trials: list[Trial] = []
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: stop every server
    for scenario in SCENARIOS:
        for replicas in (0, 1):
            for _ in range(args.trials):
                trial = run_trial(scenario, replicas, rng)
                trials.append(trial)
                print(f"failover: {json.dumps(asdict(trial))}", flush=True)
    print(f"\n{platform.platform(terse=True)}, seed {args.seed}, lease {LEASE:g} s\n")
    print(table(trials))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump([asdict(trial) for trial in trials], out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
