"""The published benchmark plots, drawn from one run's results (``benchmarks.run``).

``locks.png``: contended throughput (scenario B) and hand-off latency (scenario C, p50 and
p99) per library. ``waiters.png``: scenario E, commands per hand-off and hand-off latency
against the number of waiters (log x). Every value is a median over the run's repetitions,
the same value its table shows. ``hotkey.png``: the hot-key benchmark (issue 23), the
distinct-key and the hot-key calls done over time per conflict policy, from the run with
the median completion of the distinct-key calls. ``fair_after.png``: scenario B with ours
under FIFO and each ``fair_after`` setting, critical sections/s and wait p99, python-redis-lock
as a horizontal reference line.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.bench_hotkey import LABELS as HOTKEY_LABELS
from benchmarks.bench_hotkey import POLICIES, representative
from benchmarks.bench_lock import CONTENDERS, E_WAITING, e_points, median_of, status_of
from benchmarks.contenders import FAIR_MS

Results = dict[str, dict[str, list[dict[str, Any]]]]

#: One colour per lock across both figures (ours first, in the Tableau palette).
COLOURS = {
    "csl": "#1f77b4",
    "csl fallback_poll=30": "#17becf",
    "csl-plain": "#aec7e8",
    "redis-py": "#d62728",
    "redis-py sleep=0.001": "#ff9896",
    "python-redis-lock": "#2ca02c",
    "pottery": "#9467bd",
    "floor": "#7f7f7f",
}


def _pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend (no display needed)."""
    import matplotlib  # noqa: PLC0415  (the bench extra; imported only to draw)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt


def _spread(runs: Sequence[dict[str, Any]], field: str) -> tuple[float, float, float]:
    """(median, min, max) of ``field`` over the runs that have it."""
    values = [r[field] for r in runs if isinstance(r.get(field), int | float)]
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return float("nan"), float("nan"), float("nan")
    return median_of(runs, field), min(values), max(values)


def _save(fig: Any, path: Path, caption: str) -> Path:
    """Caption ``fig``, lay it out, write it to ``path`` and close it."""
    fig.suptitle(caption, fontsize=8, y=0.995)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    # No "Software" text chunk: the file changes only when the figures do.
    fig.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None})
    _pyplot().close(fig)
    return path


def plot_locks(results: Results, path: Path, caption: str) -> Path | None:
    """Scenario B throughput and scenario C latency, one bar group per library."""
    b, c = results.get("B", {}), results.get("C", {})
    names = [n for n in CONTENDERS if b.get(n) or c.get(n)]
    if not names:
        return None
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
    xs = range(len(names))
    colours = [COLOURS.get(n, "#333333") for n in names]

    medians, lows, highs = zip(*(_spread(b.get(n, []), "throughput") for n in names), strict=True)
    err = [[m - lo for m, lo in zip(medians, lows, strict=True)],
           [hi - m for m, hi in zip(medians, highs, strict=True)]]  # fmt: skip
    left.bar(xs, medians, color=colours, yerr=err, capsize=3)
    for x, value in zip(xs, medians, strict=True):
        if not math.isnan(value):
            left.annotate(f"{value:,.0f}", (x, value), ha="center", va="bottom", fontsize=8,
                          xytext=(0, 3), textcoords="offset points")  # fmt: skip
    left.set_title("B. Flash sale, 100 clients: critical sections/s (higher is better)")
    left.set_ylabel("critical sections per second (median; bars: min–max)")

    width = 0.38
    for offset, field, label, alpha in ((-width / 2, "p50_ms", "p50", 1.0),
                                        (width / 2, "p99_ms", "p99", 0.45)):  # fmt: skip
        values = [median_of(c.get(n, []), field) for n in names]
        right.bar([x + offset for x in xs], values, width, color=colours, alpha=alpha,
                  edgecolor="black", linewidth=0.4, label=label)  # fmt: skip
        for x, value in zip(xs, values, strict=True):
            if not math.isnan(value):
                right.annotate(f"{value:.2f}" if value < 10 else f"{value:.0f}",
                               (x + offset, value), ha="center", va="bottom", fontsize=7,
                               xytext=(0, 2), textcoords="offset points")  # fmt: skip
    right.set_yscale("log")
    right.set_title("C. Hand-off latency, release → waiter's acquire (lower is better)")
    right.set_ylabel("ms (log scale; solid p50, pale p99)")
    right.legend(loc="upper left", fontsize=8)

    for axis in (left, right):
        axis.set_xticks(list(xs))
        axis.set_xticklabels(names, rotation=25, ha="right", fontsize=8)
        axis.grid(axis="y", alpha=0.3)
    return _save(fig, path, caption)


def plot_waiters(results: Results, path: Path, caption: str) -> Path | None:
    """Scenario E: commands per hand-off and hand-off latency against N, log x."""
    e = results.get("E", {})
    series = {}
    for name in E_WAITING:
        points = {n: runs for n, runs in e_points(e.get(name, [])).items()
                  if status_of(runs) == "ok"}  # fmt: skip
        if points:
            series[name] = points
    if not series:
        return None
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5.6))
    for name, points in series.items():
        ns = list(points)
        colour = COLOURS.get(name, "#333333")
        left.plot(ns, [median_of(r, "commands") for r in points.values()], "o-", color=colour,
                  label=f"{name}: commands")  # fmt: skip
        left.plot(ns, [median_of(r, "round_trips") for r in points.values()], "s:",
                  color=colour, alpha=0.7, label=f"{name}: round trips")  # fmt: skip
        right.plot(ns, [median_of(r, "p50_ms") for r in points.values()], "o-", color=colour,
                   label=f"{name}: p50")  # fmt: skip
        right.plot(ns, [median_of(r, "p99_ms") for r in points.values()], "^--", color=colour,
                   alpha=0.6, label=f"{name}: p99")  # fmt: skip
    left.set_title("E. Redis commands and round trips per hand-off")
    left.set_ylabel("per hand-off (median over runs)")
    left.set_ylim(bottom=0)
    right.set_title("E. Hand-off latency")
    right.set_ylabel("ms (log scale)")
    right.set_yscale("log")
    ticks = sorted({n for points in series.values() for n in points})
    for axis in (left, right):
        axis.set_xscale("log")
        axis.set_xticks(ticks)
        axis.set_xticklabels([f"{n:,}" for n in ticks])
        axis.minorticks_off()
        axis.set_xlabel("waiters blocked on the lock (log scale)")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.16))
    return _save(fig, path, caption)


def plot_fair(results: Results, path: Path, caption: str) -> Path | None:
    """Scenario B: ours under FIFO and each fair_after setting against python-redis-lock."""
    b = results.get("B", {})
    settings = [("csl", "FIFO\n(default)")] + [
        (name, f"fair_after\n{ms:g} ms") for name, ms in FAIR_MS.items()
    ]
    settings = [(n, label) for n, label in settings if b.get(n)]
    if not settings:
        return None
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.4))
    xs = list(range(len(settings)))
    prl = b.get("python-redis-lock", [])
    for axis, field, title, unit in (
        (left, "throughput", "B. 100 clients, one lock: critical sections/s (higher is better)",
         "critical sections per second (median; bars: min–max)"),
        (right, "wait_p99_ms", "B. wait p99 (lower is better)", "ms (median; bars: min–max)"),
    ):  # fmt: skip
        medians, lows, highs = zip(*(_spread(b[n], field) for n, _ in settings), strict=True)
        err = [[m - lo for m, lo in zip(medians, lows, strict=True)],
               [hi - m for m, hi in zip(medians, highs, strict=True)]]  # fmt: skip
        axis.bar(xs, medians, color=COLOURS["csl"], yerr=err, capsize=3)
        for x, value in zip(xs, medians, strict=True):
            if not math.isnan(value):
                axis.annotate(f"{value:,.0f}" if value >= 10 else f"{value:.1f}", (x, value),
                              ha="center", va="bottom", fontsize=8, xytext=(0, 3),
                              textcoords="offset points")  # fmt: skip
        reference = median_of(prl, field)
        if not math.isnan(reference):
            axis.axhline(reference, color=COLOURS["python-redis-lock"], linestyle="--",
                         label=f"python-redis-lock {reference:,.1f}")  # fmt: skip
            axis.legend(fontsize=8, loc="lower right")
        tops = [v for v in (*highs, reference) if not math.isnan(v)]
        if tops:
            axis.set_ylim(0, max(tops) * 1.15)
        axis.set_title(title, fontsize=10)
        axis.set_ylabel(unit)
        axis.set_xticks(xs)
        axis.set_xticklabels([label for _, label in settings], fontsize=8)
        axis.grid(axis="y", alpha=0.3)
    return _save(fig, path, caption)


#: One colour per conflict policy of the hot-key plot.
HOTKEY_COLOURS = {"none": "#7f7f7f", "park": "#1f77b4", "wait": "#d62728", "retry": "#2ca02c"}


def plot_hotkey(results: dict[str, list[dict[str, Any]]], path: Path, caption: str) -> Path | None:
    """The hot-key benchmark (``bench_hotkey``): per policy, the share of the distinct-key
    calls done against time since the first publish (left), and the hot key's calls done
    (right, log time). Each curve is one run: the run with the median completion of the
    distinct-key calls, so the curve ends at the value of the table."""
    chosen = {p: representative(results.get(p, [])) for p, _ in POLICIES}
    drawn = {p: run for p, run in chosen.items() if run is not None}
    if not drawn:
        return None
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    for policy, run in drawn.items():
        colour = HOTKEY_COLOURS.get(policy, "#333333")
        label = HOTKEY_LABELS[policy].replace("`", "")
        cold = [ms / 1000 for ms in run["cold_ends_ms"]]
        if cold:
            left.step([0.0, *cold], [i / len(cold) for i in range(len(cold) + 1)],
                      where="post", color=colour, label=label)  # fmt: skip
        hot = [ms / 1000 for ms in run.get("hot_ends_ms", [])]
        if hot:
            right.step(hot, range(1, len(hot) + 1), where="post", color=colour, label=label)
    left.set_title("Distinct-key calls done (higher and further left is better)")
    left.set_xlabel("seconds since the first publish")
    left.set_ylabel("share of the distinct-key calls done")
    left.set_xlim(left=0)
    left.set_ylim(0, 1.02)
    right.set_title("Hot-key calls done (one at a time)")
    right.set_xlabel("seconds since the first publish (log scale)")
    right.set_ylabel("hot-key calls done")
    right.set_xscale("log")
    left.legend(fontsize=8, loc="lower right")
    right.legend(fontsize=8, loc="upper left")
    for axis in (left, right):
        axis.grid(alpha=0.3)
    return _save(fig, path, caption)
