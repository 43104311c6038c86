"""``python -m tests.invariants``: run seeded scenarios and print the figures.

    python -m tests.invariants --scenarios 20 --seed 100 --json build/invariants.json
    python -m tests.invariants --seed 107 --scenarios 1 --modes coalesce,replace   # one again
    python -m tests.invariants --recheck build/invariants/seed-107/observation.json

Scenario ``i`` of a run has seed ``S + i``: a violation's seed re-runs that scenario alone
(same modes, workers, calls and faults, at the same offsets; real processes, so not the
same interleaving). Each scenario runs in a process of its own (``--jobs`` at once; each
starts three redis-servers and its workers). Exit status: 1 when a violation outside a
restart of the lock Redis was found, 2 when a scenario could not run, else 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.invariants.checker import KINDS, NOT_THE_LOCK, Verdict, check
from tests.invariants.modes import MODES
from tests.invariants.records import Observation
from tests.invariants.runner import run_in_subprocess
from tests.invariants.scenario import FAULT_KINDS, Scenario, generate

__all__ = ["main", "summarise"]


def _restarts(value: str) -> bool | None:
    return {"auto": None, "always": True, "never": False}[value]


Result = tuple[Scenario, Observation | None, Verdict | None]


def summarise(results: Sequence[Result]) -> dict[str, Any]:
    """The figures of a run of scenarios (the JSON the CLI writes)."""
    faults: Counter[str] = Counter()
    terminals: Counter[str] = Counter()
    safe: Counter[str] = Counter()
    restart: Counter[str] = Counter()
    transport = 0
    modes: dict[str, Counter[str]] = {}
    examples: dict[str, dict[str, Any]] = {}
    limits: dict[str, Counter[str]] = {}
    calls = failed = 0
    for spec, _, verdict in results:
        if verdict is None:
            failed += 1
            continue
        figures = verdict.figures
        calls += figures["calls"]
        faults.update(figures["faults"])
        terminals.update(figures["terminals"])
        for name, row in figures["modes"].items():
            counter = modes.setdefault(name, Counter())
            counter["calls"] += row["calls"]
            counter["violations"] += row["violations"]
            counter["transport"] += row["transport"]
            counter["after_restart"] += row["after_restart"]
            counter.update({f"terminal:{k}": v for k, v in row["terminals"].items()})
        for name, seen in figures.get("limits", {}).items():
            row = limits.setdefault(name, Counter())
            row["scenarios"] += 1
            row["full"] += int(seen["peak"] >= seen["number"])
            row["peak"] = max(row["peak"], seen["peak"])
            row["number"] = seen["number"]
        transport += len(verdict.transport)
        for item in verdict.violations:
            if item.restart:
                restart[item.kind] += 1
            elif item.kind not in NOT_THE_LOCK:
                safe[item.kind] += 1
            label = f"{item.kind}{' (restart)' if item.restart else ''}"
            examples.setdefault(label, {"seed": spec.seed, "line": item.line(),
                                        "violation": verdict.to_json()["violations"][
                                            verdict.violations.index(item)]})  # fmt: skip
    return {
        "scenarios": len(results),
        "scenarios_not_run": failed,
        "calls": calls,
        "faults": dict(sorted(faults.items())),
        "terminals": dict(sorted(terminals.items())),
        "violations": dict(sorted(safe.items())),
        "violations_after_restart": dict(sorted(restart.items())),
        "lost_in_transport": transport,
        "modes": {name: dict(sorted(c.items())) for name, c in sorted(modes.items())},
        "limits": {name: dict(sorted(c.items())) for name, c in sorted(limits.items())},
        "examples": examples,
        "seeds_with_violations": sorted(
            {spec.seed for spec, _, v in results if v is not None and v.safe}
        ),
    }


def _print(figures: dict[str, Any]) -> None:
    def line(counter: dict[str, int]) -> str:
        return ", ".join(f"{name} {count}" for name, count in counter.items()) or "none"

    print(f"scenarios: {figures['scenarios']} ({figures['scenarios_not_run']} could not run)")
    print(f"calls: {figures['calls']}")
    print(f"faults by kind: {line(figures['faults'])}")
    print(f"terminal states: {line(figures['terminals'])}")
    print(f"violations by kind: {line(figures['violations'])}")
    print(f"violations under a lock Redis restart: {line(figures['violations_after_restart'])}")
    print(
        f"calls lost by the broker transport as a worker was killed (not the lock): "
        f"{figures['lost_in_transport']}"
    )
    print("per mode (calls / violations / under restart, then terminal states):")
    for name, row in figures["modes"].items():
        states = ", ".join(f"{k.split(':', 1)[1]} {v}" for k, v in row.items()
                           if k.startswith("terminal:"))  # fmt: skip
        print(f"  {name:<16} {row.get('calls', 0):>4} / {row.get('violations', 0):>3} / "
              f"{row.get('after_restart', 0):>3}   {states}")  # fmt: skip
    if figures.get("limits"):
        print("stacked limits (highest weight inside, restarts included / number; full in):")
        for name, row in figures["limits"].items():
            print(f"  {name:<16} {row['peak']:>3} / {row['number']:<3} full in {row['full']} "
                  f"of {row['scenarios']} scenario(s)")  # fmt: skip
    if figures["examples"]:
        print("one example per kind:")
        for label, example in figures["examples"].items():
            print(f"  {label}: {example['line']}")


def main(argv: Sequence[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.invariants",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--scenarios", type=int, default=10, help="how many (default 10)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first scenario")
    parser.add_argument("--json", type=Path, help="write the figures and verdicts here")
    parser.add_argument("--jobs", type=int, default=1, help="scenarios at once (default 1)")
    parser.add_argument("--modes", help=f"comma-separated modes (default: 3-5 drawn from "
                        f"{', '.join(MODES)})")  # fmt: skip
    parser.add_argument("--faults", help=f"comma-separated fault kinds ({', '.join(FAULT_KINDS)}"
                        "); default: 1-3 drawn")  # fmt: skip
    parser.add_argument(
        "--restarts",
        choices=("auto", "always", "never"),
        default="auto",
        help="restart-class scenarios: one in four (auto), all, none",
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=None,
        help="seconds of calls per scenario (default: 6-10 drawn)",
    )
    parser.add_argument("--work-dir", type=Path, help="keep logs and observations here")
    parser.add_argument(
        "--recheck",
        type=Path,
        nargs="*",
        help="judge saved observation.json files again; run nothing",
    )
    args = parser.parse_args(argv)
    if args.recheck:
        results = []
        for path in args.recheck:
            obs = Observation.load(path)
            spec_path = path.with_name("scenario.json")
            if spec_path.exists():
                spec = Scenario.from_json(json.loads(spec_path.read_text()))
            else:  # a soak's records: no plan
                spec = Scenario(obs.seed or 0, [], obs.workers, [], [], 0.0, False)
            verdict = check(obs)
            for item in verdict.violations:
                print(item.line())
            results.append((spec, obs, verdict))
        _print(summarise(results))
        return 1 if any(v.safe for _, _, v in results) else 0
    modes = args.modes.split(",") if args.modes else None
    faults = args.faults.split(",") if args.faults else None
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="csl-invariants-"))
    specs = [
        generate(args.seed + index, modes=modes, restarts=_restarts(args.restarts),
                 faults=faults, duration=args.duration)
        for index in range(args.scenarios)
    ]  # fmt: skip
    began = time.monotonic()

    def one(spec: Scenario) -> Result:
        obs, output = run_in_subprocess(spec, work / f"seed-{spec.seed}")
        if obs is None:
            print(f"seed {spec.seed}: could not run:\n{output[-3000:]}", flush=True)
            return spec, None, None
        verdict = check(obs)
        (work / f"seed-{spec.seed}" / "verdict.json").write_text(
            json.dumps(verdict.to_json(), indent=1) + "\n", encoding="utf-8"
        )
        print(f"{spec.summary()}\n  -> {verdict.figures['calls']} calls, "
              f"{len(verdict.safe)} violations, {len(verdict.under_restart)} under restart",
              flush=True)  # fmt: skip
        for item in verdict.violations:
            print(f"     {item.line()}", flush=True)
        return spec, obs, verdict

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(one, specs))
    figures = summarise(results)
    figures["seconds"] = round(time.monotonic() - began, 1)
    figures["work_dir"] = str(work)
    figures["kinds"] = dict(KINDS)
    print(f"---- {figures['scenarios']} scenarios in {figures['seconds']:.0f} s "
          f"(logs: {work}) ----")  # fmt: skip
    _print(figures)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        verdicts = [
            {"seed": spec.seed, "summary": spec.summary(),
             "verdict": verdict.to_json() if verdict else None}
            for spec, _, verdict in results
        ]  # fmt: skip
        args.json.write_text(json.dumps({**figures, "scenarios_run": verdicts}, indent=1,
                                        default=str) + "\n", encoding="utf-8")  # fmt: skip
    if figures["scenarios_not_run"]:
        return 2
    return 1 if any(v is not None and v.safe for _, _, v in results) else 0


if __name__ == "__main__":
    sys.exit(main())
