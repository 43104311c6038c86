"""Beat replicas through failovers, ``LeaderScheduler`` beside RedBeat, in one run:
``python -m benchmarks.beat_failover [--minutes N] [--lease S] [--json PATH] [--markdown PATH]``.

For each scheduler, the rig of ``tests/replicas/harness.py``: three ``celery beat``
replicas, a worker, a broker and a lock Redis (private redis-servers), a schedule of
entries every 1 s and every 5 s (one sent by name), and a ledger outside the lock Redis.
For ``--minutes`` the leader is, in rounds: SIGKILLed (and started again), SIGSTOPped past
its lease then resumed, cut from the lock Redis past its lease (a stalled proxy), and the
lock Redis is restarted with its data (append-only file); at the end of the run the lock
Redis is restarted empty once (what a restart that loses data costs is reported apart).
Each fault waits for the next send by another replica (bounded) and a few seconds of
steady sends.

RedBeat runs with its documented HA settings: ``redbeat_lock_timeout`` = the lease,
``beat_max_loop_interval`` a third of it; a replica whose process exits by itself (RedBeat
raises when it loses its lock) is started again, as a supervisor would, and counted.
LeaderScheduler's sends are judged by their exact slots (its messages carry them). RedBeat's
messages name no slot, so its sends are judged by their times: a send closer than half a
period to the previous one of its entry is a duplicate, a gap of g periods loses g - 1
slots.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.replicas.harness import Rig, analyse

__all__ = ["main", "run"]

KINDS = ("ours", "redbeat")
#: Seconds of steady sends after each fault, before the next.
SETTLE = 4.0


def run(kind: str, minutes: float, lease: float, seed: int, run_dir: Path) -> dict[str, Any]:
    """One scheduler through ``minutes`` of faults; its figures."""
    rng = random.Random(seed)
    rig = Rig(kind, run_dir, lease=lease)
    faults = ("kill", "stop", "cut", "restart")
    try:
        rig.start()
        if not rig.wait_sends(4, rig.started_at, bound=90):
            raise RuntimeError(f"{kind}: no sends at start")
        end = time.monotonic() + minutes * 60
        round_ = 0
        while time.monotonic() < end:
            order = list(faults)
            rng.shuffle(order)
            for fault in order:
                if time.monotonic() >= end:
                    break
                pause = lease + rng.uniform(1.0, 3.0)
                if fault == "kill":
                    rig.kill_leader()
                elif fault == "stop":
                    rig.stop_leader(pause)
                elif fault == "cut":
                    rig.cut_leader(pause)
                else:
                    rig.restart_lock(keep_data=True)
                rig.wait_sends(3, rig.faults[-1].ended, bound=60)
                time.sleep(SETTLE * rng.uniform(0.5, 1.5))
                rig.revive()
            round_ += 1
        rig.restart_lock(keep_data=False)
        rig.wait_sends(6, rig.faults[-1].ended, bound=60)
        time.sleep(SETTLE)
    finally:
        rig.stop()
    figures = analyse(rig, rig.final)
    figures["rounds"] = round_
    return figures


def _seconds(values: Sequence[float | None]) -> str:
    found = sorted(value for value in values if value is not None)
    if not found:
        return "—"
    median = found[len(found) // 2]
    missing = len(values) - len(found)
    extra = f", {missing} never" if missing else ""
    return f"median {median:.2f} s, max {found[-1]:.2f} s ({len(found)}{extra})"


def _faults(figures: dict[str, Any]) -> str:
    counts: dict[str, int] = {}
    for fault in figures["faults"]:
        counts[fault["kind"]] = counts.get(fault["kind"], 0) + 1
    return ", ".join(f"{count} {kind}" for kind, count in counts.items())


def markdown(report: dict[str, Any]) -> str:
    """The side-by-side table of a report (docs/beat.md quotes it)."""
    ours, theirs = report["results"]["ours"], report["results"]["redbeat"]
    rows = [
        ("run", f"{ours['seconds']:.0f} s", f"{theirs['seconds']:.0f} s"),
        ("faults injected", _faults(ours), _faults(theirs)),
        ("sends", ours["sends"], theirs["sends"]),
        ("duplicate sends (ours: exact slots; RedBeat: judged by time)", ours["duplicates"],
         theirs["duplicates"]),
        ("slots not sent, all causes (ours: exact; RedBeat: judged by time)",
         ours["lost"] + ours["lost_by_catch_up_rule"], theirs["lost"]),
        ("of which beyond the catch-up rule", ours["lost"], "— (no such rule)"),
        ("seconds in which two replicas sent", ours["seconds_with_two_senders"],
         theirs["seconds_with_two_senders"]),
        ("replicas that exited by themselves (started again)", ours["replicas_crashed"],
         theirs["replicas_crashed"]),
    ]  # fmt: skip
    kinds = {
        "leader_kill": "failover after a leader SIGKILL",
        "leader_stop": "failover after a leader SIGSTOP past the lease",
        "leader_cut": "failover after a leader cut from the lock Redis",
        "redis_restart_kept": "first send after a lock Redis restart (data kept)",
        "redis_restart_lost": "first send after a lock Redis restart (data lost)",
    }
    for kind, label in kinds.items():
        rows.append(
            (
                label,
                _seconds(ours["failover_seconds"].get(kind, [])),
                _seconds(theirs["failover_seconds"].get(kind, [])),
            )
        )
    rows.append(
        (
            "after the restart that lost data: duplicates / slots lost",
            f"{ours['duplicates_after_data_loss']} / {ours['lost_after_data_loss']}",
            f"{theirs['duplicates_after_data_loss']} / {theirs['lost_after_data_loss']}",
        )
    )
    lines = [
        f"| {report['lease']:g} s lease, 3 replicas | LeaderScheduler | RedBeat "
        f"{report['environment']['redbeat']} |",
        "|---|---|---|",
    ]
    lines += [f"| {name} | {a} | {b} |" for name, a, b in rows]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=3.0, help="per scheduler")
    parser.add_argument("--lease", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", choices=KINDS, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--markdown", type=Path, default=None)
    parser.add_argument("--run-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    try:
        from importlib.metadata import version  # noqa: PLC0415

        redbeat = version("celery-redbeat")
    except Exception:
        redbeat = None
    kinds = [args.only] if args.only else list(KINDS)
    if "redbeat" in kinds and redbeat is None:
        print("celery-redbeat is not installed: pip install 'celery-singleton-lock[bench]'")
        return 2
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="csl-beat-failover-"))
    results = {}
    for kind in kinds:
        started = time.monotonic()
        results[kind] = run(kind, args.minutes, args.lease, args.seed, run_dir / kind)
        print(f"{kind}: {time.monotonic() - started:.0f} s", file=sys.stderr)
        print(json.dumps({k: v for k, v in results[kind].items() if k != "faults"}, indent=2))
    report = {
        "command": "python -m benchmarks.beat_failover " + " ".join(argv or sys.argv[1:]),
        "lease": args.lease,
        "minutes": args.minutes,
        "seed": args.seed,
        "environment": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "redbeat": redbeat,
        },
        "results": results,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    if len(results) == len(KINDS):
        table = markdown(report)
        print(table)
        if args.markdown:
            args.markdown.parent.mkdir(parents=True, exist_ok=True)
            args.markdown.write_text(table)
    failed = results.get("ours", {})
    return 1 if failed.get("duplicates") or failed.get("lost") else 0


if __name__ == "__main__":
    sys.exit(main())
