"""Issue 24's targets, evaluated on one run's results (pure: no Redis, no Celery).

``rows(lock, celery, memory)`` gives one row per target figure: what it is, the measured
figure, the target, and ``met`` / ``MISSED`` / ``not measured`` (a figure that is NaN or
missing is never judged). ``table(rows)`` renders them as markdown. Every figure comes from
the results passed in; nothing here is a constant of a past run.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Row", "judge", "rows", "table"]

Result = dict[str, Any]
NAN = float("nan")
PRL = "python-redis-lock"


@dataclass(frozen=True)
class Row:
    """One target: label, measured figure(s) as text, the target as text, the verdict."""

    label: str
    measured: str
    target: str
    verdict: str


def judge(values: Iterable[float], good: Callable[[], bool]) -> str:
    """``met`` / ``MISSED``, or ``not measured`` when a value is missing (NaN)."""
    values = list(values)
    if not values or any(not isinstance(v, int | float) or math.isnan(v) for v in values):
        return "not measured"
    return "met" if good() else "MISSED"


def _num(value: float, digits: int = 2) -> str:
    return "—" if math.isnan(value) else f"{value:,.{digits}f}"


def _x(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.2f}×"


def _values(runs: Sequence[Result], field: str) -> list[float]:
    found = [r.get(field) for r in runs if r.get("status", "ok") == "ok"]
    return [float(v) for v in found if isinstance(v, int | float) and not math.isnan(v)]


def median_of(runs: Sequence[Result], field: str) -> float:
    """Median of ``field`` over the runs with status ok."""
    values = _values(runs, field)
    return statistics.median(values) if values else NAN


def paired(runs: Sequence[Result], reference: Sequence[Result], field: str) -> float:
    """Median over runs of ``field`` / the reference's ``field`` in the same run."""
    ratios = []
    for mine, theirs in zip(runs, reference, strict=False):
        a, b = mine.get(field), theirs.get(field)
        if mine.get("status") != "ok" or theirs.get("status") != "ok":
            continue
        if isinstance(a, int | float) and isinstance(b, int | float) and b and not math.isnan(a):
            ratios.append(a / b)
    return statistics.median(ratios) if ratios else NAN


def lock_rows(
    lock: dict[str, dict[str, list[Result]]], fair: Sequence[tuple[str, float]]
) -> list[Row]:
    """Rows 1-4: the lock engine (scenarios A, B with its fair_after variants, C)."""
    a = lock.get("A", {}).get("csl", [])
    b, c = lock.get("B", {}), lock.get("C", {})
    rt, x_floor = median_of(a, "round_trips"), median_of(a, "x_floor")
    us = median_of(a, "median_us")
    floor_us = median_of(lock.get("A", {}).get("floor", []), "median_us")
    out = [
        Row(
            "1. uncontended acquire + release: round trips",
            _num(rt),
            "≤ 2",
            judge([rt], lambda: rt <= 2),
        ),
        Row(
            "1. uncontended acquire + release: time against the floor (`SET NX PX` + Lua "
            "compare-and-delete)",
            f"{_x(x_floor)} (paired per block; {_num(us, 1)} vs {_num(floor_us, 1)} µs/pair)",
            "≤ 1.15×",
            judge([x_floor], lambda: x_floor <= 1.15),
        ),
    ]
    prl = b.get(PRL, [])

    def contended(name: str, label: str, cs_min: float, p99_max: float) -> list[Row]:
        runs = b.get(name, [])
        cs, p99 = paired(runs, prl, "throughput"), paired(runs, prl, "wait_p99_ms")
        return [
            Row(
                f"{label}: critical sections/s against python-redis-lock",
                f"{_x(cs)} ({_num(median_of(runs, 'throughput'), 0)} vs "
                f"{_num(median_of(prl, 'throughput'), 0)} CS/s)",
                f"≥ {cs_min:.1f}×",
                judge([cs], lambda: cs >= cs_min),
            ),
            Row(
                f"{label}: wait p99 against python-redis-lock's",
                f"{_x(p99)} ({_num(median_of(runs, 'wait_p99_ms'), 1)} vs "
                f"{_num(median_of(prl, 'wait_p99_ms'), 1)} ms)",
                f"≤ {p99_max:.1f}×",
                judge([p99], lambda: p99 <= p99_max),
            ),
        ]

    out += contended("csl", "2. 100 clients, one lock, FIFO (default)", 1.0, 0.5)
    for name, ms in fair:
        label = f"3. 100 clients, `fair_after={ms / 1000:g}` ({ms:g} ms)"
        out += contended(name, label, 1.3, 1.0)
        runs = [r for r in b.get(name, []) if r.get("status") == "ok" and r.get("fairness")]
        checks = [r["fairness"] for r in runs]
        overtaken = float(sum(f["violations"] for f in checks)) if checks else NAN
        holds = sum(f["holds"] for f in checks)
        over = max((f["over_ms"] for f in checks), default=NAN)
        out.append(
            Row(
                f"{label}: no waiter waits longer than the setting plus one hand-off past the "
                "moment it became head",
                f"{_num(overtaken, 0)} of {holds:,} waiters overtaken after their due release; "
                f"longest head wait {_num(over, 1)} ms beyond {ms:g} ms",
                "0 overtaken",
                judge([overtaken], lambda overtaken=overtaken: overtaken == 0),
            )
        )
    ours, theirs = c.get("csl", []), c.get(PRL, [])
    p50 = median_of(ours, "p50_ms") / median_of(theirs, "p50_ms")
    p99 = median_of(ours, "p99_ms") / median_of(theirs, "p99_ms")
    out += [
        Row(
            "4. hand-off latency p50 against python-redis-lock's",
            f"{_x(p50)} ({_num(median_of(ours, 'p50_ms'))} vs "
            f"{_num(median_of(theirs, 'p50_ms'))} ms)",
            "≤ 0.9×",
            judge([p50], lambda: p50 <= 0.9),
        ),
        Row(
            "4. hand-off latency p99 against python-redis-lock's",
            f"{_x(p99)} ({_num(median_of(ours, 'p99_ms'))} vs "
            f"{_num(median_of(theirs, 'p99_ms'))} ms)",
            "≤ 1.0×",
            judge([p99], lambda: p99 <= 1.0),
        ),
    ]
    return out


def celery_rows(celery: dict[str, Result]) -> list[Row]:
    """Rows 5 and 6: Celery drains (``bench_celery.summarise``'s ratios to plain) and lock
    CPU per task against celery-once's (its paired ``lock_cpu_x_once`` when the summary has
    one, else the ratio of the two medians)."""

    def get(name: str, field: str) -> float:
        row = celery.get(name) or {}
        value = row.get(field, NAN) if row.get("status") == "ok" else NAN
        return float(value) if isinstance(value, int | float) else NAN

    out = []
    once = get("celery-once", "lock_cpu_us")
    for scope in ("run", "queue"):
        name = f"csl-{scope}"
        ratio = get(name, "ratio")
        out.append(
            Row(
                f"5. Celery, trivial tasks, {scope} scope: drain against a plain task's",
                f"{_x(ratio)} ({_num(get(name, 'drain_rate'), 0)} vs "
                f"{_num(get('plain', 'drain_rate'), 0)} tasks/s)",
                "≥ 0.90×",
                judge([ratio], lambda ratio=ratio: ratio >= 0.90),
            )
        )
        cpu = get(name, "lock_cpu_us")
        x = get(name, "lock_cpu_x_once")
        if math.isnan(x):
            x = cpu / once if once and not math.isnan(once) and once > 0 else NAN
        out.append(
            Row(
                f"5. Celery, trivial tasks, {scope} scope: lock CPU per task (producer + worker "
                "processes + lock Redis, minus a plain task's) against celery-once's",
                f"{_x(x)} ({_num(cpu, 0)} vs {_num(once, 0)} µs/task)",
                "≤ 1.5×",
                judge([x], lambda x=x: x <= 1.5),
            )
        )
    for scope in ("run", "queue"):
        name = f"csl-{scope}-5ms"
        ratio = get(name, "ratio")
        out.append(
            Row(
                f"6. Celery, 5 ms bodies, {scope} scope: drain against a plain task's",
                f"{_x(ratio)} ({_num(get(name, 'drain_rate'), 0)} vs "
                f"{_num(get('plain-5ms', 'drain_rate'), 0)} tasks/s)",
                "≥ 0.97×",
                judge([ratio], lambda ratio=ratio: ratio >= 0.97),
            )
        )
    return out


def memory_rows(memory: Result | None) -> list[Row]:
    """Row 7: queue-scope lock-Redis memory per finished task, and after the keep time."""
    memory = memory or {}
    per = memory.get("bytes_per_task", NAN)
    tasks = memory.get("tasks", 0)
    floors = memory.get("floors") or {}
    floor_text = ""
    if floors:
        cheapest = min(floors.items(), key=lambda kv: kv[1])
        per_key = [v for k, v in floors.items() if "one key per task" in k]
        floor_text = (
            f"; floors: a key per task with a TTL "
            f"{_num(per_key[0] if per_key else NAN, 1)} B, cheapest shape "
            f"{_num(cheapest[1], 1)} B ({cheapest[0]})"
        )
    after = memory.get("keep_after_bytes_per_task", NAN)
    left = memory.get("keep_after_keys", NAN)
    keep_tasks = memory.get("keep_tasks", 0)
    return [
        Row(
            f"7. queue scope: lock-Redis memory after {tasks:,} finished tasks",
            f"{_num(per, 1)} B/task{floor_text}",
            "≤ 100 B/task",
            judge([per], lambda: per <= 100),
        ),
        Row(
            "7. queue scope: left per task once no redelivery can happen "
            "(`lock_queue_timeout=2`, "
            f"{keep_tasks:,} tasks)",
            f"{_num(after, 2)} B/task, {_num(float(left), 0)} keys left, "
            f"{_num(memory.get('keep_gone_s', NAN), 1)} s after the last task",
            "≤ 1 B/task, 0 keys",
            judge([after, float(left)], lambda: after <= 1 and left == 0),
        ),
    ]


def rows(
    lock: dict[str, dict[str, list[Result]]],
    celery: dict[str, Result],
    memory: Result | None,
    fair: Sequence[tuple[str, float]],
) -> list[Row]:
    """Every target row of issue 24, in the issue's order."""
    return [*lock_rows(lock, fair), *celery_rows(celery), *memory_rows(memory)]


def table(found: Sequence[Row]) -> list[str]:
    """The rows as a markdown table, then a count of the verdicts."""
    lines = ["| target (issue 24) | measured | target | verdict |", "|---|---|---|---|"]
    lines += [
        f"| {r.label} | {r.measured} | {r.target} | "
        f"{'**MISSED**' if r.verdict == 'MISSED' else r.verdict} |"
        for r in found
    ]
    counts = {v: sum(1 for r in found if r.verdict == v) for v in ("met", "MISSED", "not measured")}
    lines += ["", ", ".join(f"{n} {v}" for v, n in counts.items()) + f" of {len(found)} rows."]
    return lines
