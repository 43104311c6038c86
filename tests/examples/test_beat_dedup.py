"""The beat-dedup example: a schedule faster than its job, deduplicated two ways."""

from __future__ import annotations

import re

import pytest

from tests.examples.conftest import run_example

pytestmark = pytest.mark.slow


def test_runs_never_overlap_nor_pile_up_in_either_variant() -> None:
    """Ticks every 0.5 s for a 2 s job over 6 s: in both variants the runs follow one
    another without overlap, at most 4 of them, and the queue holds no backlog."""
    done = run_example(
        "examples.beat_dedup.run", "--seconds", "6", "--job-seconds", "2", "--every", "0.5",
        timeout=90,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    for variant in ("queue", "by_name"):
        assert f"[ok] {variant}: runs never overlap" in done.stdout
        summary = re.search(rf"^{variant}: beat sent (\d+) ticks, (\d+) reached", done.stdout, re.M)
        assert summary is not None, done.stdout
        assert int(summary.group(1)) >= 6  # beat really ticked faster than the job ran
    queue = re.search(
        r"^queue: beat sent (\d+) ticks, (\d+) reached the worker, (\d+) ran", done.stdout, re.M
    )
    assert queue is not None
    assert int(queue.group(2)) == int(queue.group(3))  # duplicates were never published
    assert "all checks passed" in done.stdout
