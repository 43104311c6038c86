"""The pipelines name no mode (issue 33): ``runtime/`` holds no string literal equal to a
registered conflict policy, scope or mode option value, so what differs between modes
stays in their hooks and attributes. The ``lock_on_lost`` and ``lock_order`` branches and
the stacked-limit branch of ``on_limit`` are hooks of the mode or policy."""

from __future__ import annotations

import ast
from pathlib import Path

from celery_singleton_lock import options, runtime
from celery_singleton_lock.modes import PHASES, POLICIES, SCOPES, plan_for
from celery_singleton_lock.options import LockOptions

RUNTIME = Path(runtime.__file__).parent


def registered_values() -> set[str]:
    """Every value a policy, scope or mode option may take."""
    values = set(POLICIES) | set(SCOPES)
    for name in ("CONFLICT_POLICIES", "SCOPES", "ON_LOST", "ORDERS", "RELEASES"):
        values |= set(getattr(options, name))
    return values


def literals_in(path: Path) -> list[tuple[int, str]]:
    """The string literals of ``path`` (docstrings included: a docstring is prose, but
    none of ours needs a bare option value as its whole text)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def test_runtime_compares_no_registered_name() -> None:
    values = registered_values()
    assert {"park", "queue", "raise", "enqueue", "success"} <= values
    found = [
        f"{path.name}:{line}: {text!r}"
        for path in sorted(RUNTIME.glob("*.py"))
        for line, text in literals_in(path)
        if text in values
    ]
    assert found == []


def test_the_check_sees_a_name() -> None:
    """The scan does find a literal equal to a registered value (a test that can fail)."""
    tree = ast.parse('if options.order == "enqueue":\n    pass\n')
    texts = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)]
    assert "enqueue" in texts
    assert "enqueue" in registered_values()


def test_a_task_with_default_options_runs_no_hook() -> None:
    """A plan lists per phase only the hooks that change it: with default options, none."""
    plan = plan_for(LockOptions())
    assert {phase: getattr(plan, phase) for phase in PHASES} == dict.fromkeys(PHASES, ())
    queued = plan_for(LockOptions(scope="queue", on_lost="raise"))
    assert [type(mode).__name__ for mode in queued.guard] == ["RaiseOnLost"]
    assert [type(mode).__name__ for mode in queued.claim] == ["QueueScope"]
