"""Seeded scenarios on real workers and redis-servers: every call of every mode ends in
exactly one terminal, reported state, and no mode breaks its promise (see
``tests/invariants/checker.py`` for the invariants, docs/soak.md for how to run more).

Each test runs one generated scenario in a process of its own (three private
redis-servers, one or two ``celery worker`` processes), with busy workers, countdowns,
duplicate publishes and the faults named below, then judges what happened. A failure
prints every violation with the scenario's seed; ``python -m tests.invariants --seed S
--scenarios 1 --modes ... --faults ...`` runs it again. In the restart scenario the lock
Redis is also restarted empty: what a restart may break is reported (printed), and only
violations outside a restart's window fail the test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.invariants.checker import check
from tests.invariants.runner import run_in_subprocess
from tests.invariants.scenario import generate

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

#: name -> (seed, modes, faults, restart class)
SCENARIOS = {
    "run_scope": (
        2101, ["run_skip", "run_wait", "run_retry", "run_raise", "limit2"],
        ["child_kill", "redis_stall"], False,
    ),
    "queue_scope": (
        2102, ["queue_skip", "queue_raise", "release_start", "success_queue", "rate_queue"],
        ["worker_kill", "redis_stall"], False,
    ),
    "followups": (
        2103, ["coalesce", "replace", "replace_running", "coalesce_rate"],
        ["child_kill", "redis_stall"], False,
    ),
    # run_wait runs in run_scope already: its place here goes to the stacked limits (three
    # modes sharing grp:{key} and global budgets), at the size of the other scenarios.
    "debounce_and_stacked": (
        2104, ["debounce", "debounce_max", "stack_wait", "stack_skip", "stack_retry"],
        ["child_kill", "redis_stall"], False,
    ),
    "throttle_and_lifetimes": (
        2105, ["rate_retry", "success_run", "limit2_success"], ["worker_kill", "redis_stall"],
        False,
    ),
    "park": (
        2107, ["park", "park_queue", "park_order", "park_limit2_rate"],
        ["child_kill", "worker_kill", "parked_kill", "redis_stall"], False,
    ),
    "restart": (
        2106, ["coalesce", "debounce", "rate_retry", "success_run", "queue_skip"],
        ["redis_restart"], True,
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_call_ends_in_one_reported_state(name: str, tmp_path: Path) -> None:
    seed, modes, faults, restarts = SCENARIOS[name]
    spec = generate(seed, modes=modes, faults=faults, restarts=restarts, duration=6.0)
    observation, output = run_in_subprocess(spec, tmp_path, timeout=360)
    assert observation is not None, f"the scenario could not run:\n{output[-4000:]}"
    verdict = check(observation)
    for item in verdict.under_restart:
        print(f"under a restart: {item.line()}")
    assert len(observation.calls) == len(spec.calls)
    lines = "\n".join(item.line() for item in verdict.safe)
    assert not verdict.safe, (
        f"{len(verdict.safe)} violation(s) in {spec.summary()}\n{lines}\n"
        f"figures: {verdict.figures}\nlogs: {tmp_path}\n"
        + _log_lines(tmp_path, [task for item in verdict.safe for task in item.task_ids])
    )


def _log_lines(where: Path, task_ids: list[str], most: int = 80) -> str:
    """The worker log lines that name one of ``task_ids`` (what happened to a violating
    call, printed with the failure: a CI run's temporary directory does not outlive it)."""
    found = [
        f"{path.name}: {line}"
        for path in sorted(where.rglob("*.log"))
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines()
        if any(task_id in line for task_id in task_ids)
    ]
    return "log lines of those calls:\n" + "\n".join(found[-most:])
