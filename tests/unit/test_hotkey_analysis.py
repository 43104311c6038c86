"""The hot-key benchmark's figures and checks (``benchmarks.bench_hotkey``) on hand-made run
records: gaps, exactly-once, overlap, ratios and the table are computed as their
definitions say, and a violation replaces the figures it would otherwise publish."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks.bench_hotkey import (
    SECTION_BEGIN,
    SECTION_END,
    Record,
    analyse,
    exactly_once,
    gaps_ms,
    overlaps,
    parse_record,
    plan,
    representative,
    summarise,
    table,
    targets,
    write_section,
)


def hot(n: int, start: float, end: float, retries: int = 0) -> Record:
    return Record("hot", n, start, end, retries)


def cold(n: int, start: float, end: float, retries: int = 0) -> Record:
    return Record("cold", n, start, end, retries)


def test_a_body_line_parses_into_a_record() -> None:
    """The line a body RPUSHes, as bytes from Redis or as text."""
    assert parse_record(b"hot 3 100.000100 100.020200 2") == hot(3, 100.0001, 100.0202, 2)
    assert parse_record("cold 0 1.5 1.52 0") == cold(0, 1.5, 1.52)


def test_the_plan_interleaves_hot_and_distinct_calls_hot_first() -> None:
    """Hot and distinct-key calls alternate; the baseline has no hot call."""
    assert plan("park", 2, 3) == [("hot", 0), ("cold", 0), ("hot", 1), ("cold", 1), ("cold", 2)]
    assert plan("none", 2, 2) == [("cold", 0), ("cold", 1)]


def test_exactly_once_names_missing_repeated_and_unknown_calls() -> None:
    """Each call of the plan must run once: a missing one, one run twice and a run of a
    call never made are each reported; a complete record is clean."""
    expected = [("hot", 0), ("hot", 1), ("cold", 0)]
    clean = [hot(0, 0, 1), hot(1, 1, 2), cold(0, 0, 1)]
    assert exactly_once(clean, expected) == []
    problems = exactly_once([hot(0, 0, 1), hot(0, 1, 2), cold(7, 0, 1)], expected)
    assert len(problems) == 3
    assert problems[0].startswith("2 call(s) never ran (first cold 0, hot 1)")
    assert problems[1] == "1 call(s) ran more than once (first hot 0 x2)"
    assert problems[2].startswith("1 run(s) of calls never made (first cold 7)")


def test_runs_of_the_hot_key_overlap_only_beyond_the_clock_tolerance() -> None:
    """A start before the previous end by more than 1 ms is an overlap; touching runs and
    0.5 ms of clock noise are not; a long run overlaps every run inside it."""
    assert overlaps([hot(0, 0.0, 1.0), hot(1, 1.0, 2.0), hot(2, 1.9995, 3.0)]) == []
    found = overlaps([hot(0, 0.0, 1.0), hot(1, 0.9, 2.0)])
    assert found == ["hot 1 started 100.0 ms before hot 0 ended"]
    assert len(overlaps([hot(0, 0.0, 10.0), hot(1, 1.0, 2.0), hot(2, 3.0, 4.0)])) == 2


def test_gaps_run_from_one_end_to_the_next_start_in_start_order() -> None:
    """Gaps in milliseconds, whatever order the records came in."""
    runs = [hot(1, 1.003, 1.02), hot(0, 1.0, 1.001), hot(2, 1.03, 1.05)]
    assert gaps_ms(runs) == pytest.approx([2.0, 10.0])
    assert gaps_ms([hot(0, 0, 1)]) == []


def test_analyse_gives_the_figures_of_a_clean_measurement() -> None:
    """Times are after the first publish (t0); retries are summed over the hot calls."""
    t0 = 100.0
    records = [
        hot(0, 100.0, 100.02),
        cold(0, 100.0, 100.02),
        hot(1, 100.022, 100.042, retries=2),
        cold(1, 100.02, 100.5),
        hot(2, 100.046, 100.066, retries=1),
    ]
    expected = plan("park", 3, 2)
    result = analyse(records, t0, expected)
    assert result["status"] == "ok"
    assert result["cold_done_s"] == pytest.approx(0.5)
    assert result["total_s"] == pytest.approx(0.5)
    assert result["hot_span_s"] == pytest.approx(0.066)
    assert result["gap_p50_ms"] == pytest.approx(3.0)  # gaps 2 and 4 ms
    assert result["gap_p95_ms"] == pytest.approx(3.9)
    assert (result["hot_retries"], result["hot_retried_calls"], result["hot_retries_max"]) == (
        3,
        2,
        2,
    )
    assert result["cold_ends_ms"] == [20.0, 500.0]
    assert result["hot_retried"] == [[1, 2, 22.0], [2, 1, 46.0]]


def test_a_violation_replaces_the_figures() -> None:
    """An overlap or a missing run: no figure, the violations instead."""
    overlapping = [hot(0, 0.0, 1.0), hot(1, 0.5, 1.5), cold(0, 0.0, 0.1)]
    result = analyse(overlapping, 0.0, plan("park", 2, 1))
    assert result["status"].startswith("VIOLATION: hot key overlap: hot 1 started")
    assert "cold_done_s" not in result
    missing = analyse([hot(0, 0.0, 1.0)], 0.0, plan("park", 1, 1))
    assert missing["violations"] == ["1 call(s) never ran (first cold 0)"]


def run(cold_done: float, **more: Any) -> dict[str, Any]:
    """A measurement's result with the figures the summary reads."""
    return {
        "status": "ok", "cold_done_s": cold_done, "total_s": cold_done + 1, "hot_span_s": 1.0,
        "gap_p50_ms": 2.0, "gap_p95_ms": 4.0, "gap_max_ms": 9.0, "hot_retries": 0,
        "hot_retried_calls": 0, "hot_retries_max": 0, "cold_retries": 0, "publish_s": 0.1,
        "cpu_s": 1.0, "cpu_main_s": 0.3, "cpu_pool_s": 0.5, "cpu_redis_s": 0.2,
        "messages_per_call": 1.5, "cold_ends_ms": [], **more,
    }  # fmt: skip


def test_the_ratio_to_the_baseline_is_paired_per_run() -> None:
    """Medians per policy over the ok runs; the ratio is the median over runs of park's
    figure over the baseline's in the same run (1.5/1.0, 1.2/2.0, 9.0/1.2), not the ratio
    of the medians (1.5/1.2)."""
    results = {
        "none": [run(1.0), run(2.0), run(1.2)],
        "park": [run(1.5), run(1.2), run(9.0)],
    }
    summary = summarise(results)
    assert summary["park"]["cold_done_s"] == pytest.approx(1.5)
    assert summary["park"]["ratio"] == pytest.approx(1.5)
    assert (summary["park"]["cold_done_min"], summary["park"]["cold_done_max"]) == (1.2, 9.0)
    assert summary["none"]["ratio"] == pytest.approx(1.0)
    rendered = table(summary).splitlines()
    assert len(rendered) == 4  # header, rule, one row per policy in the results
    assert "| 1.50 (1.20–9.00) | 1.50x | 2.0 | 4.0 (9) | 0 (runs: 0, 0, 0; 0; 0) |" in rendered[3]
    assert rendered[3].endswith("| 1.50 | 1.00 = 0.30 + 0.50 + 0.20 | ok (3/3 runs) |")


def test_a_failed_run_on_either_side_leaves_its_pair_out() -> None:
    """Runs are matched by their ``run`` number; a run whose baseline or own measurement
    failed gives no ratio."""
    results = {
        "none": [run(1.0, run=0), {"status": "stalled", "run": 1}, run(2.0, run=2)],
        "park": [run(3.0, run=2), run(5.0, run=1), run(1.2, run=0)],
    }
    assert summarise(results)["park"]["ratio"] == pytest.approx((3.0 / 2.0 + 1.2 / 1.0) / 2)


def test_a_policy_with_a_violation_shows_no_figures() -> None:
    """One violating run among good ones: the row is a VIOLATION, loudly, in the table and
    the targets, with no figure published for it."""
    bad = {"status": "VIOLATION: x", "violations": ["1 call(s) ran more than once"], "run": 0}
    summary = summarise({"none": [run(1.0)], "park": [run(1.1), bad], "wait": [run(3.0)]})
    assert summary["park"]["status"] == "VIOLATION"
    assert "cold_done_s" not in summary["park"]
    rendered = table(summary)
    assert "| N/A: VIOLATION |" in rendered
    assert "**VIOLATION** run 1: 1 call(s) ran more than once" in rendered
    lines = targets(summary)
    assert lines[0].endswith("-> not measured")
    assert lines[-1] == "- **VIOLATION** (park): run 1: 1 call(s) ran more than once"


def test_targets_are_marked_met_or_missed() -> None:
    """park: ratio <= 1.2, gap p50 <= 5 ms, no retries in any run (not just the median)."""
    summary = summarise(
        {"none": [run(1.0)], "park": [run(1.3, gap_p50_ms=4.0)], "wait": [run(4.0)]}
    )
    lines = targets(summary)
    assert lines[0] == (
        "- Hot key. park: the last distinct-key call done <= 1.2x the no-hot-key baseline: "
        "1.30x (wait 4.00x, retry —) -> MISSED"
    )
    assert lines[1] == "- Hot key. park: hot-key gap p50 <= 5 ms: 4.0 ms -> met"
    assert lines[2] == "- Hot key. park: retries of the hot key's calls = 0 in every run: 0 -> met"
    retried = summarise({"park": [run(1.0), run(1.0, hot_retries=3), run(1.0)]})
    assert targets(retried)[2].endswith("= 0 in every run: 0, 3, 0 -> MISSED")


def test_the_plot_draws_the_median_run() -> None:
    """The run whose distinct-key completion is the median (the lower middle of an even
    count); failed runs are left out."""
    runs = [run(3.0), run(1.0), {"status": "stalled"}, run(2.0)]
    assert representative(runs) == runs[3]
    assert representative([run(2.0), run(1.0)]) == run(1.0)
    assert representative([{"status": "stalled"}]) is None


def test_write_section_replaces_inserts_or_appends(tmp_path: Path) -> None:
    """An existing section is replaced in place; without one the section goes before the
    anchor line (benchmarks.run's block end), or at the end of the file."""
    doc = tmp_path / "bench.md"
    doc.write_text("# Title\n\nintro\n<!-- END -->\n\nafter\n")
    write_section(doc, [SECTION_BEGIN, "first", SECTION_END], anchor="<!-- END -->")
    assert doc.read_text() == (
        f"# Title\n\nintro\n\n{SECTION_BEGIN}\nfirst\n{SECTION_END}\n\n<!-- END -->\n\nafter\n"
    )
    write_section(doc, [SECTION_BEGIN, "second", SECTION_END], anchor="<!-- END -->")
    assert "first" not in doc.read_text()
    assert doc.read_text().count(SECTION_BEGIN) == 1
    assert f"{SECTION_BEGIN}\nsecond\n{SECTION_END}\n\n<!-- END -->" in doc.read_text()
    other = tmp_path / "other.md"
    other.write_text("text\n")
    write_section(other, [SECTION_BEGIN, "x", SECTION_END], anchor="<!-- END -->")
    assert other.read_text() == f"text\n\n{SECTION_BEGIN}\nx\n{SECTION_END}\n"
