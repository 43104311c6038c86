"""Issue 24's benchmark analysis on hand-made records: the head-of-line reconstruction
(``benchmarks.fairness``) and the target table (``benchmarks.targets24``) compute what
their definitions say, and a missing figure is never judged."""

from __future__ import annotations

import math
from typing import Any

from benchmarks.fairness import Hold, head_moments, head_waits, percentile
from benchmarks.targets24 import judge, memory_rows, paired, rows, table

MS = 1_000_000


def fifo(n: int, hold_ms: int = 1, arrive_ms: int = 0) -> list[Hold]:
    """``n`` clients all queued at ``arrive_ms`` + i µs, served in arrival order back to
    back, each holding ``hold_ms``."""
    holds = []
    t = 10 * MS
    for i in range(n):
        holds.append(Hold(enq=arrive_ms * MS + i * 1000, acq=t, rel=t + hold_ms * MS))
        t += hold_ms * MS + 100_000
    return holds


def test_head_moment_is_the_previous_waiters_acquire() -> None:
    """A waiter becomes head when the last client queued before it acquired (or when it
    queued itself, if later)."""
    holds = [Hold(0, 5, 6), Hold(1, 7, 8), Hold(20, 21, 22)]
    assert head_moments(holds) == [0, 5, 20]


def test_head_moment_ignores_the_order_holds_are_given_in() -> None:
    """The reconstruction sorts by queue entry, whatever order the records come in."""
    holds = [Hold(20, 21, 22), Hold(1, 7, 8), Hold(0, 5, 6)]
    assert head_moments(holds) == [20, 5, 0]


def test_fifo_service_has_no_overtaking() -> None:
    """Served in queue order, no waiter is overtaken and head waits are one hold plus the
    gap (the first waited 10 ms for a lock nobody held in these records)."""
    report = head_waits(fifo(50), fair_ns=0)
    assert report["holds"] == 50
    assert report["violations"] == 0
    assert report["jumped_max"] == 0
    assert math.isclose(report["head_p50_ms"], 1.1, rel_tol=1e-6)
    assert math.isclose(report["head_max_ms"], 10.0, rel_tol=1e-6)


def test_a_barger_after_the_due_release_is_a_violation() -> None:
    """A client that queued later but takes the lock at the release after the head's due
    moment overtakes the head: one violation, one hold in between."""
    head = Hold(enq=0, acq=30 * MS, rel=31 * MS)
    holder = Hold(enq=-1, acq=0, rel=10 * MS)
    barger = Hold(enq=5 * MS, acq=11 * MS, rel=29 * MS)
    report = head_waits([holder, head, barger], fair_ns=2 * MS)
    assert report["violations"] == 1
    assert report["jumped_max"] == 1
    assert math.isclose(report["over_ms"], 28.0)


def test_a_client_queued_in_the_same_instant_is_not_an_overtaker() -> None:
    """A client whose first request was written while the head's was still in flight may
    have queued first: its taking the lock first is no violation."""
    holder = Hold(enq=-1, acq=0, rel=10 * MS)
    head = Hold(enq=0, acq=30 * MS, rel=31 * MS, queued=6 * MS)
    twin = Hold(enq=5 * MS, acq=11 * MS, rel=29 * MS, queued=7 * MS)
    report = head_waits([holder, head, twin], fair_ns=2 * MS)
    assert report["violations"] == 0
    assert head_moments([holder, head, twin])[1] == 11 * MS


def test_barging_before_the_due_moment_is_allowed() -> None:
    """With fair_after 20 ms, a newcomer taking the lock 11 ms after the head became head
    is no violation."""
    holder = Hold(enq=-1, acq=0, rel=10 * MS)
    head = Hold(enq=0, acq=30 * MS, rel=31 * MS)
    barger = Hold(enq=5 * MS, acq=11 * MS, rel=29 * MS)
    report = head_waits([holder, head, barger], fair_ns=20 * MS)
    assert report["violations"] == 0


def test_no_holds_is_no_figure() -> None:
    """An empty run yields NaN figures and no violations."""
    report = head_waits([], fair_ns=0)
    assert report["holds"] == 0
    assert math.isnan(report["head_p99_ms"])


def test_percentile_interpolates() -> None:
    """Linear interpolation between ranks."""
    assert percentile([0.0, 10.0], 50) == 5.0
    assert math.isnan(percentile([], 50))


def test_judge() -> None:
    """met / MISSED, and never a verdict on a NaN."""
    assert judge([1.0], lambda: True) == "met"
    assert judge([1.0], lambda: False) == "MISSED"
    assert judge([float("nan")], lambda: True) == "not measured"
    assert judge([], lambda: True) == "not measured"


def test_paired_skips_failed_runs() -> None:
    """Per-run ratios, failed runs on either side left out."""
    mine = [{"status": "ok", "x": 2.0}, {"status": "timeout", "x": 9.0}, {"status": "ok", "x": 3.0}]
    ref = [{"status": "ok", "x": 1.0}, {"status": "ok", "x": 1.0}, {"status": "ok", "x": 1.0}]
    assert paired(mine, ref, "x") == 2.5


def b_run(cs: float, p99: float, violations: int = 0) -> dict[str, Any]:
    return {
        "status": "ok",
        "throughput": cs,
        "wait_p99_ms": p99,
        "fairness": {"violations": violations, "holds": 1000, "over_ms": 1.0},
    }


def test_rows_from_results() -> None:
    """Each row's verdict follows from the figures given; missing parts are not measured."""
    lock = {
        "A": {
            "csl": [{"status": "ok", "round_trips": 2.0, "x_floor": 1.10, "median_us": 110}],
            "floor": [{"status": "ok", "median_us": 100}],
        },
        "B": {
            "csl": [b_run(2000, 100)],
            "python-redis-lock": [b_run(1800, 250)],
            "csl fair_after=5ms": [b_run(2500, 260, violations=2)],
        },
        "C": {
            "csl": [{"status": "ok", "p50_ms": 0.5, "p99_ms": 1.0}],
            "python-redis-lock": [{"status": "ok", "p50_ms": 0.6, "p99_ms": 2.0}],
        },
    }
    celery = {
        "plain": {"status": "ok", "drain_rate": 1000.0, "lock_cpu_us": 0.0},
        "csl-run": {"status": "ok", "drain_rate": 950.0, "ratio": 0.95, "lock_cpu_us": 400.0},
        "csl-queue": {"status": "ok", "drain_rate": 800.0, "ratio": 0.80, "lock_cpu_us": 700.0},
        "celery-once": {"status": "ok", "lock_cpu_us": 300.0},
    }
    found = {r.label: r.verdict for r in rows(lock, celery, None, [("csl fair_after=5ms", 5.0)])}
    assert found["1. uncontended acquire + release: round trips"] == "met"
    assert [v for k, v in found.items() if k.startswith("2.")] == ["met", "met"]
    fair = [v for k, v in found.items() if k.startswith("3.")]
    assert fair == ["met", "MISSED", "MISSED"]  # 1.39x CS/s; p99 1.04x; 2 overtaken
    assert [v for k, v in found.items() if k.startswith("4.")] == ["met", "met"]
    five = [v for k, v in found.items() if k.startswith("5.")]
    assert five == ["met", "met", "MISSED", "MISSED"]  # 400/300 = 1.33x; 700/300 = 2.33x
    assert {v for k, v in found.items() if k.startswith(("6.", "7."))} == {"not measured"}


def test_memory_rows_print_the_floor() -> None:
    """A missed memory row shows the per-key floor beside it; the keep row needs 0 keys."""
    memory = {
        "tasks": 100_000,
        "bytes_per_task": 247.0,
        "floors": {"SET key 1-byte value PX (one key per task)": 149.7, "shared": 68.2},
        "keep_tasks": 20_000,
        "keep_after_bytes_per_task": 0.0,
        "keep_after_keys": 0,
        "keep_gone_s": 2.5,
    }
    first, keep = memory_rows(memory)
    assert first.verdict == "MISSED"
    assert "149.7" in first.measured
    assert "68.2" in first.measured
    assert keep.verdict == "met"
    lines = table([first, keep])
    assert "**MISSED**" in lines[2]
    assert lines[-1] == "1 met, 1 MISSED, 0 not measured of 2 rows."
