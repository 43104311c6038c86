"""The soak's report as Markdown, rendered from its JSON form (so a committed JSON report
can be rendered again: ``python -m benchmarks.soak.report docs/soak/report.json``)."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["FAULT_NAMES", "headline", "markdown", "restarts"]

#: How each fault kind is named in the report.
FAULT_NAMES = {
    "child_kill": "SIGKILL of a pool process",
    "worker_kill": "SIGKILL of a whole worker (restarted)",
    "worker_stop": "SIGSTOP of a whole worker past the lease, then SIGCONT",
    "redis_stop": "SIGSTOP of the lock Redis (data kept)",
    "redis_restart": "restart of the lock Redis (every lock lost)",
    "net_stall": "worker–Redis connections stalled past the lease (proxy)",
    "net_cut": "worker–Redis connections cut (proxy)",
    "clock_skew": "worker restarted with its wall clock far off",
    "beat_kill": "SIGKILL of the leading beat replica (restarted)",
}


def _number(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.2f}".rstrip("0").rstrip(".")
    return str(value)


def _seconds(summary: Mapping[str, Any]) -> str:
    if not summary.get("count"):
        return "—"
    return f"median {_number(summary['median'])} s, max {_number(summary['max'])} s"


def _lost(figures: Mapping[str, Any]) -> str:
    text = _number(figures["lost_tasks"])
    transport = figures.get("lost_in_broker_transport", 0)
    if transport:
        text += (
            f" (+ {transport} taken off the broker by a worker SIGKILLed before it recorded "
            "them: kombu's Redis transport, not the lock)"
        )
    return text


def headline(report: Mapping[str, Any]) -> str:
    """The table the README quotes."""
    figures = report["figures"]
    config = report["config"]
    faults = figures["faults"]
    per_kind = ", ".join(f"{count} {kind}" for kind, count in faults.items())
    rows = [
        ("soak", f"{_number(config['minutes'])} min, {config['workers']} workers × 2 "
                 f"processes (prefork, `acks_late`) + beat, lease {config['lease']:g} s"),
        ("tasks sent / completed / skipped by policy",
         f"{_number(figures['tasks_sent'])} / {_number(figures['tasks_completed'])} / "
         f"{_number(figures['tasks_skipped_by_policy'])}"),
        ("faults injected", f"{figures['faults_total']}: {per_kind}"),
        ("overlaps while Redis kept its data", _number(figures["overlaps_data_kept"])),
        ("lost tasks", _lost(figures)),
        ("duplicate executions", _number(figures["duplicate_executions"])),
        ("fencing-order violations", _number(figures["fencing_order_violations"])),
        ("stale writes refused by fencing", _number(figures["stale_writes_refused"])),
        ("paused holders told their lease was lost",
         f"{figures['paused_holders'] - figures['paused_holders_not_told']} of "
         f"{figures['paused_holders']}"),
        ("overlaps after a restart lost the locks",
         f"{figures['overlaps_after_data_loss']} "
         f"({_seconds(figures['overlap_seconds_after_data_loss'])})"),
        ("recovery after a crash (key with a waiting run)",
         _seconds(figures["recovery_wait_policy"])),
        ("lock Redis commands per task", _number(figures["lock_commands_per_task"])),
    ]  # fmt: skip
    beat = figures.get("beat")
    if beat:
        rows.append((
            "beat (3 replicas): slots sent / sent twice while Redis kept its data / leader kills",
            f"{_number(beat['slots_sent'])} / {_number(beat['slots_sent_twice_data_kept'])} / "
            f"{_number(beat['leader_kills'])} (failover {_seconds(beat['failover'])})",
        ))  # fmt: skip
    modes = figures.get("modes")
    if modes:
        rows.append((
            "modes: calls / violations while Redis kept its data / across a restart",
            f"{_number(modes['calls'])} calls in {len(modes['modes'])} modes / "
            f"{_number(modes['safe_violations'])} / "
            f"{_number(modes['violations_after_restart_total'])}",
        ))  # fmt: skip
    code = figures.get("code")
    if code:
        rows.append((
            "code (every worker and beat from one snapshot)",
            f"{code['revision'] or '—'}, digest {code['digest'][:12]}: "
            f"{_number(code['processes_reported'])} of {_number(code['processes_started'])} "
            f"processes reported it, {_number(len(code['other_code']))} ran other code",
        ))  # fmt: skip
    lines = ["| | |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in rows]
    return "\n".join(lines)


def restarts(report: Mapping[str, Any]) -> str:
    """What the restarts of the lock Redis did in this run, for docs/soak.md: how many
    there were, the locked bodies they hit, the holds the audit found gone and the
    overlaps seen; and the command that runs the same seed again."""
    figures, config = report["figures"], report["config"]
    count = figures["faults"].get("redis_restart", 0)
    hit = sum(len(fault["held"]) for fault in report["faults"] if fault["kind"] == "redis_restart")
    missing = figures["holds_missing_after_data_loss"]
    overlaps = figures["overlaps_after_data_loss"]
    text = (
        f"In the committed run the {count} restarts hit {hit} running bodies; the audit found "
        f"{missing} holds gone before their commit (those bodies stopped and their tasks ran "
        "again), and "
    )
    if overlaps:
        lengths = _seconds(figures["overlap_seconds_after_data_loss"])
        text += f"{overlaps} overlaps were seen ({lengths}): the lock itself was gone."
    else:
        text += (
            "no overlap was seen. That is luck of the workload, not a promise: the lock "
            "itself was gone."
        )
    return (
        text
        + "\n\nTo run the committed report again: "
        + f'`make soak MINUTES={_number(config["minutes"])} ARGS="--seed {config["seed"]}"` '
        "(the faults land at other moments on another machine, so the figures differ; the "
        "targets must not).\n"
    )


def _targets(targets: Sequence[Mapping[str, Any]]) -> str:
    lines = ["| target | value | goal | met | kind |", "|---|---|---|---|---|"]
    for row in targets:
        kind = "safety" if row["safety"] else "liveness"
        met = "✅" if row["met"] else "❌"
        lines.append(
            f"| {row['name']} | {_number(row['value'])} | {row['target']} | {met} | {kind} |"
        )
    return "\n".join(lines)


def _fault_table(report: Mapping[str, Any]) -> str:
    rows: dict[str, list[float]] = {}
    for row in report["recoveries"]:
        if row["seconds"] is not None:
            rows.setdefault(row["fault"], []).append(row["seconds"])
    lines = [
        "| fault | injected | locked bodies hit | recovery of their keys (max s) |",
        "|---|---|---|---|",
    ]
    counts = report["figures"]["faults"]
    kinds = report["config"].get("kinds", FAULT_NAMES)
    for kind, name in FAULT_NAMES.items():
        if kind not in kinds:
            continue  # a kind this soak did not inject (a report from before it existed)
        hit = sum(len(fault["held"]) for fault in report["faults"] if fault["kind"] == kind)
        times = rows.get(kind)
        worst = _number(round(max(times), 2)) if times else "—"
        lines.append(f"| {name} | {counts.get(kind, 0)} | {hit} | {worst} |")
    return "\n".join(lines)


def _fault_log(report: Mapping[str, Any]) -> str:
    lines = ["| t (s) | fault | target | detail | locked bodies hit |", "|---|---|---|---|---|"]
    for fault in report["faults"]:
        keys = ", ".join(key for _, key, _ in fault["held"]) or "—"
        lines.append(
            f"| {fault['t']:.1f} | {fault['kind']} | {fault['target']} | {fault['detail']} | "
            f"{keys} |"
        )
    return "\n".join(lines)


def _modes(figures: Mapping[str, Any]) -> str:
    """The modes' section: calls, terminal states and violations per mode."""
    modes = figures.get("modes")
    if not modes:
        return ""

    def counts(counter: Mapping[str, int]) -> str:
        return ", ".join(f"{count} {name}" for name, count in counter.items()) or "—"

    lines = [
        "## Modes",
        "",
        "Every call of every mode (`tests/invariants/modes.py`) must end in exactly one "
        "terminal, reported state and keep its mode's promises (`tests/invariants/checker.py`,"
        " docs/soak.md). Violations while the lock Redis kept its data are a safety target; "
        "across a restart they are reported.",
        "",
        "| mode | calls | terminal states | violations | across a restart |",
        "|---|---|---|---|---|",
    ]
    for name, row in modes["modes"].items():
        lines.append(
            f"| {name} | {_number(row['calls'])} | {counts(row['terminals'])} | "
            f"{_number(row['violations'])} | {_number(row['after_restart'])} |"
        )
    lines += [
        "",
        f"Violations by kind while Redis kept its data: {counts(modes['violations'])}; across "
        f"a restart: {counts(modes['violations_after_restart'])}; calls lost by the broker "
        f"transport as a worker was killed (kombu, not the lock): "
        f"{_number(modes['lost_in_transport'])}.",
    ]
    for title, key in (("Violations", "examples"), ("Across a restart",
                                                    "examples_after_restart")):  # fmt: skip
        if modes.get(key):
            lines += ["", f"{title} (first {len(modes[key])}):", ""]
            lines += [f"- `{line}`" for line in modes[key]]
    return "\n".join(lines) + "\n\n"


def markdown(report: Mapping[str, Any]) -> str:
    """The whole report."""
    figures = report["figures"]
    env = report["environment"]
    verdict = "every safety target met" if report["passed"] else "A SAFETY TARGET WAS MISSED"
    outcomes = ", ".join(f"{count} {name}" for name, count in figures["body_outcomes"].items())
    offsets = ", ".join(f"{name} {value:+g} s" for name, value in
                        figures["clock_offsets_by_process"].items())  # fmt: skip
    config, took = report["config"], report["timings"]["total_s"]
    return f"""# Chaos soak: {_number(config["minutes"])} minutes — {verdict}

Command: `{report["command"]}` · started {report["started"]} · took {took:.0f} s
· {env["platform"]}, {env["cpus"]} CPUs · Python {env["python"]}, Celery {env["celery"]},
kombu {env["kombu"]}, redis-py {env["redis_py"]}, {env["redis_server"]} · seed {config["seed"]}

{headline(report)}

## Targets

{_targets(report["targets"])}

{_modes(figures)}## Faults

{_fault_table(report)}

Bodies: {_number(figures["bodies"])} ({outcomes}; *killed* = its process died).
`lock_lost` signals received: {_number(figures["lock_lost_signals"])}. Queue-scope retries that
took their own hold over (same token; not a fencing violation):
{_number(figures.get("holds_continued_by_a_retry", 0))}. Stale writes refused
by fencing: {_number(figures["stale_writes_refused"])}. Lost updates while Redis kept its data:
{_number(figures["lost_updates_data_kept"])}, after a restart:
{_number(figures["lost_updates_after_data_loss"])}. Live holds found missing while Redis kept
its data: {_number(figures["holds_missing_data_kept"])}, after a restart:
{_number(figures["holds_missing_after_data_loss"])}. Bodies run with a skewed wall clock:
{_number(figures["bodies_with_skewed_clock"])} (largest offset seen per process label:
{offsets or "—"}). Lock Redis commands: {_number(figures["lock_commands"])} in all, audit
reads ({_number(figures["audit_reads"])} × 3) not counted per task. Producer:
{report["producer"]["published"]} published, {report["producer"]["deduplicated"]}
deduplicated at publish (queue scope), {report["producer"]["refused"]} refused while the
lock Redis was unreachable. CPU: {report["timings"]["cpu_s"]:.0f} s for every process of
the soak.

## Fault log

{_fault_log(report)}
"""


def main(argv: Sequence[str] | None = None) -> int:
    """Render a JSON report as Markdown on stdout."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m benchmarks.soak.report REPORT.json", file=sys.stderr)
        return 2
    print(markdown(json.loads(Path(args[0]).read_text(encoding="utf-8"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
