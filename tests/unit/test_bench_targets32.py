"""Issue 32's benchmark analysis on hand-made results: every Celery ratio is paired per
repetition and made against plain, the floor, celery-singleton and celery-once with the
same body; the sampler's and cProfile's figures of our own Python are what their
definitions say; the target table judges each row from the figures given and never a
missing one; the README paragraph the run writes still fits the README."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from benchmarks import prose
from benchmarks import run as bench_run
from benchmarks.bench_celery import Params, hot_path_report, paired, summarise, table
from benchmarks.profile_task import own_python, sampled, top_table
from benchmarks.targets24 import Row
from benchmarks.targets32 import ONE_KEY_FLOOR, drain_rows, rows
from benchmarks.targets32 import table as targets_table
from tests.docs.test_readme import README_MAX_BYTES

ROOT = Path(__file__).resolve().parents[2]
CPU = {"producer": 100.0, "lock_publish": 0.0, "children": 100.0, "parent": 500.0,
       "broker": 50.0, "lock": 0.0, "side_threads": 0.0}  # fmt: skip


def rep(run: int, rate: float, cpu: float = 0.0) -> dict[str, Any]:
    """One repetition's drain of a contender: ``cpu`` µs/task more in the pool than
    ``CPU``'s."""
    return {"status": "ok", "run": run, "drain_rate": rate, "publish_rate": 1000.0,
            "publish_cmds": 0.0, "drain_cmds": 2.0,
            "cpu_us": {**CPU, "children": CPU["children"] + cpu}}  # fmt: skip


def test_paired_matches_repetitions_and_skips_failures() -> None:
    """Ratios within one repetition, matched by ``run`` (not by position); a repetition
    that failed on either side gives none."""
    mine = [rep(1, 80.0), rep(0, 90.0), {"status": "stalled", "run": 2}]
    theirs = [rep(0, 100.0), rep(1, 200.0), rep(2, 100.0)]
    assert paired(mine, theirs, lambda r: r["drain_rate"]) == [0.9, 0.4]


def test_ratios_are_medians_of_per_repetition_ratios() -> None:
    """A machine slow in one repetition slows every contender of it: the paired ratio is
    0.9 although the medians' ratio would be 90/200 = 0.45."""
    results = {
        "plain": [rep(0, 100.0), rep(1, 200.0), rep(2, 300.0)],
        "csl-run": [rep(0, 90.0, 300.0), rep(1, 180.0, 300.0), rep(2, 270.0, 300.0)],
        "floor": [rep(0, 100.0, 100.0), rep(1, 200.0, 100.0), rep(2, 300.0, 100.0)],
        "celery-once": [rep(0, 95.0, 200.0), rep(1, 190.0, 200.0), rep(2, 285.0, 200.0)],
    }
    summary = summarise(results, {})
    run = summary["csl-run"]
    assert run["ratio"] == pytest.approx(0.9)
    assert run["ratios"] == pytest.approx([0.9, 0.9, 0.9])
    assert run["x"]["floor"] == pytest.approx(0.9)
    assert run["x"]["celery-once"] == pytest.approx(90 / 95)
    assert math.isnan(run["x"]["celery-singleton"])  # not run: no ratio
    assert run["lock_cpu_us"] == pytest.approx(300.0)
    assert run["lock_cpu_x_once"] == pytest.approx(1.5)
    assert math.isnan(summary["plain"]["lock_cpu_x_once"])
    rendered = table(summary, ["plain", "floor", "csl-run", "celery-singleton"])
    assert "| `LockedTask` run scope (ours) | 180 | 90–270 | 0.90× | 0.90× | — | 0.95× |" in (
        rendered
    )
    assert "| celery-singleton `Singleton` | N/A: not run |" in rendered


def test_five_ms_bodies_are_compared_with_five_ms_references() -> None:
    """A 5 ms-body contender's ratios use the 5 ms-body plain, floor and peers."""
    results = {
        "plain": [rep(0, 1000.0)],
        "plain-5ms": [rep(0, 300.0)],
        "floor-5ms": [rep(0, 290.0, 50.0)],
        "csl-run-5ms": [rep(0, 270.0, 150.0)],
        "celery-once-5ms": [rep(0, 280.0, 100.0)],
    }
    row = summarise(results, {})["csl-run-5ms"]
    assert row["ratio"] == pytest.approx(0.9)
    assert row["x"]["floor"] == pytest.approx(270 / 290)
    assert row["lock_cpu_x_once"] == pytest.approx(1.5)


def celery_summary(**ratios: float) -> dict[str, Any]:
    """A summary as ``bench_celery.summarise`` gives it, from the ratios to plain."""
    out: dict[str, Any] = {}
    for name, ratio in ratios.items():
        key = name.replace("_", "-")
        out[key] = {"status": "ok", "drain_rate": 1000 * ratio, "ratio": ratio,
                    "x": {"plain": ratio}}  # fmt: skip
    return out


def test_drain_rows_judge_against_plain_and_the_peers() -> None:
    """Run scope needs >= 0.90 and >= celery-singleton's ratio; the floor row >= 0.95;
    queue scope >= 0.85 and >= celery-once's."""
    summary = celery_summary(plain=1.0, csl_run=0.92, csl_queue=0.86, celery_singleton=0.93,
                             celery_once=0.85, floor=0.98)  # fmt: skip
    summary["csl-run"]["x"]["floor"] = 0.96
    verdicts = [r.verdict for r in drain_rows(summary)]
    assert verdicts == ["MISSED", "met", "met"]  # 0.92 < celery-singleton's 0.93
    summary["celery-singleton"]["ratio"] = 0.91
    summary["csl-run"]["x"]["floor"] = 0.94
    assert [r.verdict for r in drain_rows(summary)] == ["met", "MISSED", "met"]
    del summary["celery-once"]
    assert drain_rows(summary)[2].verdict == "not measured"


def test_every_row_from_a_whole_run() -> None:
    """Each row's verdict follows from the figures given; a hot key with a violation is
    MISSED whatever its ratio."""
    celery = celery_summary(plain=1.0, csl_run=0.91, csl_queue=0.80, celery_singleton=0.87,
                            celery_once=0.86, floor=1.0, plain_5ms=1.0, csl_run_5ms=0.98,
                            csl_queue_5ms=0.94)  # fmt: skip
    celery["csl-run"]["x"]["floor"] = 0.93
    celery["csl-run"].update(lock_cpu_us=400.0, lock_cpu_x_once=0.95,
                             audit={"publish_rt": 0.0, "drain_rt": 2.0})  # fmt: skip
    celery["csl-queue"].update(lock_cpu_us=600.0, lock_cpu_x_once=1.4,
                               audit={"publish_rt": 1.0, "drain_rt": 2.0})  # fmt: skip
    celery["floor"]["audit"] = {"publish_rt": 0.0, "drain_rt": 2.0}
    celery["celery-once"]["lock_cpu_us"] = 420.0
    profile = {
        "csl-run": {"ours_calls": 40.0, "ours_self_us": 150.0,
                    "sampled": {"status": "ok", "ours_cpu_us": 90.0, "ours_cpu_err_us": 5.0,
                                "pool_cpu_us": 450.0}},
    }  # fmt: skip
    memory = {"tasks": 100_000, "bytes_per_task": 158.0, "floors": {ONE_KEY_FLOOR: 149.7}}
    hotkey = {"none": {"status": "ok", "cold_done_s": 1.0},
              "park": {"status": "ok", "ratio": 1.12, "cold_done_s": 1.12}}  # fmt: skip
    found = rows(celery, profile, memory, hotkey)
    assert [r.verdict for r in found] == [
        "met",  # run x plain 0.91 >= 0.90 and >= 0.87
        "MISSED",  # run x floor 0.93
        "MISSED",  # queue x plain 0.80
        "met",  # 5 ms run 0.98
        "MISSED",  # 5 ms queue 0.94
        "met",  # lock CPU run 0.95 <= 1.0
        "MISSED",  # lock CPU queue 1.4 > 1.3
        "met",  # our own Python 90 us by the sampler
        "MISSED",  # and 150 us under cProfile
        "met",  # queue scope 3 round trips
        "met",  # run scope 2 round trips, the floor's 2
        "MISSED",  # hot key 1.12
        "met",  # 158 B
    ]
    assert "90 ± 5 µs (20 % of the pool process's 450 µs)" in found[7].measured
    assert found[8].measured.startswith("150 µs, 40.0 calls into our functions")
    assert "149.7 B" in found[12].measured
    hotkey["park"] = {"status": "VIOLATION", "violations": ["run 1: hot key overlap"]}
    assert rows(celery, profile, memory, hotkey)[11].verdict == "MISSED"
    lines = targets_table(rows({}, None, None, None))
    assert lines[-1] == "0 met, 0 MISSED, 13 not measured of 13 rows."


def test_sampled_figures() -> None:
    """Each sample stands for the CPU time covered over the samples: 2 dumps, 400 tasks,
    0.4 s in 400 samples = 1 ms each; 60 of ours = 60 ms = 150 µs per task."""
    dumps = [
        {"tasks": 250, "cpu_s": 0.25, "samples": [
            ["/x/celery_singleton_lock/engine/lock.py", 10, "acquire", 40],
            ["/x/redis/client.py", 5, "execute", 210]]},
        {"tasks": 150, "cpu_s": 0.15, "samples": [
            ["/x/celery_singleton_lock/engine/lock.py", 10, "acquire", 20],
            ["~", 0, "<built-in method posix.read>", 130]]},
    ]  # fmt: skip
    found = sampled(dumps)
    assert found["ours_cpu_us"] == pytest.approx(150.0)
    assert found["ours_cpu_err_us"] == pytest.approx(math.sqrt(60) * 2.5)
    assert found["pool_cpu_us"] == pytest.approx(1000.0)
    assert found["ours_cpu_by_function"] == {"engine/lock.py:10 acquire": pytest.approx(150.0)}
    assert sampled([])["status"] == "no samples"


def test_own_python_counts_our_frames_and_what_they_call() -> None:
    """Own time and calls of functions under celery_singleton_lock/; a built-in's own time
    counts apart, and only on the calls made from our frames."""
    ours = ("/x/celery_singleton_lock/task.py", 42, "__call__")
    theirs = ("/x/redis/client.py", 5, "execute")
    builtin = ("~", 0, "<built-in method builtins.isinstance>")
    stats = {
        ours: (100, 100, 0.010, 0.050, {}),
        theirs: (200, 200, 0.030, 0.030, {ours: (200, 200, 0.030, 0.030)}),
        builtin: (300, 300, 0.003, 0.003, {ours: (100, 100, 0.002, 0.002),
                                           theirs: (200, 200, 0.001, 0.001)}),
    }  # fmt: skip
    found = own_python(SimpleNamespace(stats=stats), 100)  # type: ignore[arg-type]
    assert found["ours_self_us"] == pytest.approx(100.0)
    assert found["ours_calls"] == pytest.approx(1.0)
    assert found["ours_callees_us"] == pytest.approx(20.0)
    assert [f["function"] for f in found["ours_top"]] == ["task.py:42 __call__"]
    assert found["ours_top"][0]["per_call_us"] == pytest.approx(100.0)


def test_hot_path_report_prints_ratios_targets_and_the_profile() -> None:
    """The fast command's output: every hot-path contender, the drain targets, the
    profile figure."""
    summary = summarise(
        {"plain": [rep(0, 100.0)], "floor": [rep(0, 98.0)], "csl-run": [rep(0, 80.0)],
         "csl-queue": [rep(0, 75.0)], "celery-singleton": [rep(0, 90.0)],
         "celery-once": [rep(0, 88.0)]}, {})  # fmt: skip
    profile = {"csl-run": {"ours_calls": 149.0, "sampled": {
        "status": "ok", "tasks_sampled": 3000, "ours_cpu_us": 181.2, "ours_cpu_err_us": 9.0,
        "pool_cpu_us": 700.0}}}  # fmt: skip
    text = "\n".join(hot_path_report(summary, profile, Params(3, 2000, 20, 0, seed=7)))
    assert "| csl-run | 80 | 0.80× | 0.82× | 0.89× | 0.91× | 0.80 |" in text
    assert "order seed 7" in text
    assert "-> MISSED" in text
    assert "181 ± 9 µs (target <= 100) of 700 µs in the pool process (26 %" in text


def test_the_readme_paragraph_still_fits_the_readme() -> None:
    """With wide figures the generated benchmark paragraph keeps README.md within the size
    its own test allows, and names the floor and both peers."""
    wide = {"status": "ok", "throughput": 99_999.0, "wait_p99_ms": 9_999.9, "p50_ms": 9.99,
            "p99_ms": 99.99, "lost": 0}  # fmt: skip
    lock = {"B": {n: [wide] for n in ("csl", "python-redis-lock", "redis-py")},
            "C": {n: [wide] for n in ("csl", "python-redis-lock")}}  # fmt: skip
    celery = {
        name: {"status": "ok", "x": {"plain": 0.99}}
        for name in ("csl-run", "csl-queue", "floor", "celery-singleton", "celery-once")
    }
    row = Row("x", "x", "x", "met")
    block = bench_run.readme_summary(
        lock, celery, stamp="2026-12-31 23:59 UTC, commit 0123456 (with uncommitted changes)",
        runs=3, cpus="2", img="docs/img/bench_locks.png", rows24=[row] * 23, rows32=[row] * 13,
    )  # fmt: skip
    text = "\n".join(block)
    assert "a bare `SET NX PX` lock 0.99×, celery-singleton 0.99×, celery-once 0.99×" in text
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    head, rest = readme.split(bench_run.README_BEGIN, 1)
    new = head + text + rest.split(bench_run.README_END, 1)[1]
    assert len(new.encode()) <= README_MAX_BYTES


def _block(rows32: list[Row], top: list[str]) -> str:
    """A generated block with issue 32's table, the run-scope table of our functions and
    then the queue-scope one (which must not be read)."""
    return "\n".join(
        [
            prose.BEGIN,
            "## This run",
            "",
            "- Machine: 2 CPUs (test)",
            "",
            "## Targets (issue 32)",
            "",
            *targets_table(rows32),
            "",
            "## Targets (issue 24)",
            "",
            "| target (issue 24) | measured | target | verdict |",
            "|---|---|---|---|",
            "",
            "## Where a locked task's time goes",
            "",
            *top,
            "",
            *[line.replace("run scope", "queue scope").replace("| 4.0 |", "| 99.0 |")
              for line in top],
            "",
            "## Hot key",
            "",
            prose.END,
        ]
    )  # fmt: skip


def test_the_reading_quotes_issue_32_rows_and_where_the_time_goes() -> None:
    """Each row of issue 32's table as printed, its verdicts counted, and, with a row
    missed, the run-scope functions with the most sampled CPU (not the queue scope's)."""
    result = {
        "ours_functions": [
            {"function": f"engine/lock.py:{n} f{n}", "calls": 1.0, "self_us": 9.0,
             "per_call_us": 9.0, "cum_us": 9.0}
            for n in range(1, 6)
        ],
        "sampled": {"ours_cpu_by_function": {"engine/lock.py:2 f2": 4.0,
                                             "engine/lock.py:4 f4": 7.5,
                                             "engine/lock.py:5 f5": 1.0}},
    }  # fmt: skip
    top = top_table(result, "ours, run scope")
    assert top[0].startswith("Our functions by the sampler's CPU time, ours, run scope (top 5)")
    assert top[4] == "| `engine/lock.py:4` `f4` | 1.00 | 7.5 | 9.0 | 9.00 | 9.0 |"
    assert top[-1] == "| `engine/lock.py:3` `f3` | 1.00 | 0.0 | 9.0 | 9.00 | 9.0 |"
    met = Row("run scope: drain × plain", "0.93× (1 vs 2)", "≥ 0.90×", "met")
    missed = Row("queue scope: round trips", "4.00 (1.00 + 3.00)", "≤ 3", "MISSED")
    block = _block([met, missed], top)
    assert [t.verdict for t in prose.targets32(block)] == ["met", "MISSED"]
    assert prose.hot_spots(block) == [
        "`engine/lock.py:4` `f4` 7.5 µs (1.00 calls per task)",
        "`engine/lock.py:2` `f2` 4.0 µs (1.00 calls per task)",
        "`engine/lock.py:5` `f5` 1.0 µs (1.00 calls per task)",
    ]
    reading = prose.reading_markdown(block)
    assert "(1 met, 1 MISSED).**" in reading
    assert "  - run scope: drain × plain: 0.93× (1 vs 2) (target ≥ 0.90×, met)." in reading
    assert "(target ≤ 3, **MISSED**)." in reading
    assert "`engine/lock.py:4` `f4` 7.5 µs" in reading
    assert "99.0 µs" not in reading  # the queue-scope table is not read
    all_met = prose.reading_markdown(_block([met], top))
    assert "Where our own time goes" not in all_met
    assert prose.targets32(block.replace("## Targets (issue 32)", "## Other")) == []
