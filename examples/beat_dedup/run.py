"""Run a worker and two beats for a few seconds and show that runs never overlap or pile up.

    python -m examples.beat_dedup.run [--seconds 8] [--job-seconds 3] [--every 1]
                                      [--redis-url URL]

Beat ticks every ``--every`` seconds for a job of ``--job-seconds``. Two variants run side
by side on one worker: ``queue`` (beat imports the task module; ``lock_scope="queue"``
stops duplicate ticks at publish time) and ``by_name`` (beat knows only the task's name;
the worker's run-time check skips ticks that arrive during a run). After ``--seconds`` the
beats stop, the last runs finish, and the script prints every run and its checks.

Exit status 0 when the checks hold, 1 otherwise, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
from dataclasses import dataclass

import redis

from examples._runtime import Stack, add_redis_url_option, guarded, redis_url_from

VARIANTS = {
    "queue": "examples.beat_dedup.tasks",
    "by_name": "examples.beat_dedup.beat_by_name",
}


@dataclass
class Run:
    """One execution of the job, in seconds since the beats started."""

    start: float
    end: float | None
    pid: int


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line; ``--help`` documents every option."""
    parser = argparse.ArgumentParser(
        prog="python -m examples.beat_dedup.run",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--seconds", type=float, default=8.0, help="how long the beats run")
    parser.add_argument("--job-seconds", type=float, default=3.0, help="how long one run takes")
    parser.add_argument("--every", type=float, default=1.0, help="beat period in seconds")
    add_redis_url_option(parser, "broker and locks")
    args = parser.parse_args(argv)
    if not 0 < args.every < args.job_seconds <= 60 or not 0 < args.seconds <= 600:
        parser.error("need 0 < --every < --job-seconds <= 60 and 0 < --seconds <= 600")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the example; return the exit status."""
    args = parse_args(argv)
    return guarded(lambda: run(args))


def run(args: argparse.Namespace) -> int:
    """Worker + two beats for ``--seconds``, then the report."""
    with Stack(redis_url_from(args), name="beat-dedup") as stack:
        namespace = stack.namespace("beat_dedup")
        stack.forget_on_close = [f"{namespace}:*"]
        env = {
            "BEAT_DEDUP_NAMESPACE": namespace,
            "BEAT_DEDUP_JOB_SECONDS": str(args.job_seconds),
            "BEAT_DEDUP_EVERY": str(args.every),
        }
        # Three pool processes: one per variant's running job, one to receive (and skip)
        # the by-name ticks that arrive meanwhile.
        stack.workers("examples.beat_dedup.tasks", concurrency=3, queue=namespace, env=env)
        began = time.time()
        beats = {
            variant: stack.beat(module, label=f"beat-{variant}", env=env, wait=False)
            for variant, module in VARIANTS.items()
        }
        stack.wait_ready(list(beats.values()))
        print(f"beats tick every {args.every:g} s for a {args.job_seconds:g} s job; "
              f"watching for {args.seconds:g} s")  # fmt: skip
        time.sleep(args.seconds)
        client = stack.client()
        backlog = int(client.llen(f"{namespace}:{namespace}"))  # messages waiting in the queue
        ticks = {variant: beat.log().count("Sending due task") for variant, beat in beats.items()}
        for beat in beats.values():
            stack.stop(beat)
        # Let the runs in progress finish (bounded), so every run has an end.
        deadline = time.monotonic() + args.job_seconds + 10
        while time.monotonic() < deadline and any(
            _open(_events(client, f"{namespace}:runs:{variant}")) for variant in VARIANTS
        ):
            time.sleep(0.1)
        results = {
            variant: (
                _runs(_events(client, f"{namespace}:runs:{variant}"), began),
                int(client.get(f"{namespace}:delivered:{variant}") or 0),
            )
            for variant in VARIANTS
        }
        client.close()
        return report(args, results, ticks, backlog)


def _events(client: redis.Redis, key: str) -> list[str]:
    """The run events recorded under ``key``."""
    return [str(event) for event in client.lrange(key, 0, -1)]


def _open(events: list[str]) -> bool:
    starts = sum(event.startswith("start") for event in events)
    return starts > len(events) - starts


def _runs(events: list[str], began: float) -> list[Run]:
    """Pair the start and end events of each pool process into runs."""
    open_runs: dict[int, Run] = {}
    runs: list[Run] = []
    for event in events:
        kind, stamp, pid = event.split()
        if kind == "start":
            open_runs[int(pid)] = run = Run(float(stamp) - began, None, int(pid))
            runs.append(run)
        elif int(pid) in open_runs:
            open_runs.pop(int(pid)).end = float(stamp) - began
    return sorted(runs, key=lambda run: run.start)


def report(
    args: argparse.Namespace,
    results: dict[str, tuple[list[Run], int]],
    ticks: dict[str, int],
    backlog: int,
) -> int:
    """Print the runs per variant and the checks; 0 when all hold."""
    checks: list[tuple[str, bool]] = []
    most = math.ceil(args.seconds / args.job_seconds) + 1
    least = 2 if args.seconds >= 2 * args.job_seconds + args.every else 1
    for variant, (runs, delivered) in results.items():
        print(
            f"{variant}: beat sent {ticks[variant]} ticks, {delivered} reached the worker, "
            f"{len(runs)} ran"
        )
        for index, run in enumerate(runs, 1):
            end = f"{run.end:6.2f}" if run.end is not None else "   ???"
            print(f"   run {index}: {run.start:6.2f} s → {end} s   (pid {run.pid})")
        apart = all(a.end is not None and b.start >= a.end for a, b in itertools.pairwise(runs))
        checks.append((f"{variant}: runs never overlap", apart))
        checks.append((f"{variant}: every run finished", all(r.end is not None for r in runs)))
        checks.append(
            (f"{variant}: {least} to {most} runs, no pile-up", least <= len(runs) <= most)
        )
    checks.append((f"queue backlog when beat stopped: {backlog} (at most 1)", backlog <= 1))
    failed = [label for label, ok in checks if not ok]
    for label, ok in checks:
        print(f"   [{'ok' if ok else 'FAILED'}] {label}")
    print("all checks passed" if not failed else f"{len(failed)} check(s) FAILED")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
