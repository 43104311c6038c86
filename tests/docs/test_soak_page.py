"""The committed soak report is a full run of today's soak: ten minutes or more, passed,
with a row for every mode the soak runs (``benchmarks.soak.modes.SOAK_MODES``); the report
page is what its JSON renders to (``test_readme.py``), and docs/soak.md's figures are the
report's (``test_figures.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.soak.modes import SOAK_MODES

ROOT = Path(__file__).resolve().parents[2]


def _report() -> dict[str, Any]:
    found: dict[str, Any] = json.loads(
        (ROOT / "docs" / "soak" / "report.json").read_text(encoding="utf-8")
    )
    return found


def test_the_committed_report_covers_every_mode_the_soak_runs() -> None:
    """A mode added to the soak (and so to the invariant checker's table) needs a new
    committed report: ``make soak MINUTES=10``, then copy build/soak/report.{json,md}."""
    report = _report()
    assert report["config"]["minutes"] >= 10
    assert report["passed"]
    modes = report["figures"].get("modes")
    assert modes is not None, "the committed report predates the modes in the soak"
    assert set(modes["modes"]) == set(SOAK_MODES)
    assert all(row["calls"] > 0 for row in modes["modes"].values()), modes["modes"]


def test_the_committed_report_is_of_todays_faults_and_beat_replicas() -> None:
    """The committed report ran every fault kind the soak injects today (``rig.FAULTS``,
    the beat leader's kill included) and judged the beat replicas (a ``beat`` row)."""
    from benchmarks.soak.rig import FAULTS  # noqa: PLC0415 - the soak's own imports

    report = _report()
    assert set(report["config"]["kinds"]) == set(FAULTS)
    assert report["figures"].get("beat") is not None, "the report predates the beat replicas"
