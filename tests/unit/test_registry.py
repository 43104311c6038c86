"""The registry of modes and the documented option values are the same set: a policy, scope
or lifetime that is documented has an object, and an object that exists is documented."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from celery_singleton_lock import options as opt
from celery_singleton_lock.modes import COMBINATIONS, MODES, POLICIES, SCOPES, plan_for
from celery_singleton_lock.modes.base import ConflictPolicy, Scope

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_every_documented_conflict_policy_has_one_policy_object() -> None:
    assert set(POLICIES) == set(opt.CONFLICT_POLICIES)
    for name, policy in POLICIES.items():
        assert isinstance(policy, ConflictPolicy)
        assert policy.name == name


def test_every_documented_scope_has_one_scope_object() -> None:
    assert set(SCOPES) == set(opt.SCOPES)
    for name, scope in SCOPES.items():
        assert isinstance(scope, Scope)
        assert scope.name == name


def test_every_lifetime_but_the_default_is_a_mode() -> None:
    """``lock_release`` values other than "end" each switch on exactly one mode."""
    for release in opt.RELEASES:
        options = dataclasses.replace(
            opt.LockOptions(),
            scope="queue",
            release=release,
            hold=1.0 if release == "success" else None,
        )
        names = {type(mode).name for mode in plan_for(options).modes}
        assert (release in names) is (release != "end"), (release, names)


@pytest.mark.parametrize(
    ("changes", "mode"),
    [
        ({"debounce": 1.0}, "debounce"),
        ({"rate_limit": "3/s"}, "rate_limit"),
        ({"scope": "queue", "release": "start"}, "start"),
        ({"release": "success", "hold": 2.0}, "success"),
        ({"scope": "queue", "limits": (("all", 3),)}, "held"),
    ],
)
def test_each_mode_applies_to_its_options_only(changes: dict[str, object], mode: str) -> None:
    plain = plan_for(opt.LockOptions())
    assert plain.modes == ()
    switched = plan_for(dataclasses.replace(opt.LockOptions(), **changes))  # type: ignore[arg-type]
    assert [type(found).name for found in switched.modes] == [mode]


def test_the_modes_page_documents_every_policy_and_mode_option() -> None:
    """docs/modes.md names every conflict policy value and every mode's option."""
    text = (DOCS / "modes.md").read_text()
    for name in POLICIES:
        assert re.search(rf'"{name}"', text), name
    for option in ("lock_debounce", "lock_rate_limit", "lock_release", "lock_hold", "lock_order"):
        assert option in text, option
    names = {kind.__name__ for kind in MODES}
    assert names == {
        "Debounce",
        "Order",
        "HoldBack",
        "Throttle",
        "ReleaseAtStart",
        "HoldAfterSuccess",
        "RaiseOnLost",
    }


@pytest.mark.parametrize(
    ("changes", "held"),
    [
        ({"on_conflict": "park", "limits": (("all", 3),)}, True),
        ({"on_conflict": "park", "rate_limit": "3/s"}, True),
        ({"on_conflict": "park"}, False),
        ({"scope": "queue", "on_conflict": "coalesce", "limits": (("all", 3),)}, True),
        ({"scope": "queue", "on_conflict": "raise", "limits": (("all", 3),)}, False),
        ({"limits": (("all", 3),)}, False),
        ({"rate_limit": "3/s", "on_conflict": "retry"}, False),
    ],
)
def test_calls_are_held_back_in_redis_only_where_they_come_back(
    changes: dict[str, object], held: bool
) -> None:
    """The held-back mode (modes.held) is on where a call a limit or a rate holds back comes
    back later (park; queue scope with limits, but for raise and wait), and only there: a
    task without it pays nothing for it."""
    options = dataclasses.replace(opt.LockOptions(), **changes)  # type: ignore[arg-type]
    assert ("held" in {type(mode).name for mode in plan_for(options).modes}) is held


def test_every_rule_is_checked_once() -> None:
    """The combination rules of the options and of every mode, each once."""
    messages = [rule.message for rule in COMBINATIONS]
    assert len(messages) == len(set(messages))
    assert len(COMBINATIONS) == 23


def test_the_park_figures_of_the_modes_page_are_the_code_s() -> None:
    """docs/modes.md quotes the sweep's interval and the hand-off restarts (of a parked
    call handed its key, of a held-back call handed out) from the code."""
    from celery_singleton_lock.modes.held import HELD_RESTART  # noqa: PLC0415
    from celery_singleton_lock.modes.park import GRANT_RESTART  # noqa: PLC0415
    from celery_singleton_lock.runtime.sweep import SWEEP_INTERVAL  # noqa: PLC0415

    text = " ".join((DOCS / "modes.md").read_text().split())
    assert f"every {SWEEP_INTERVAL:g} s (`runtime.sweep.SWEEP_INTERVAL`" in text
    assert f"within {GRANT_RESTART:g} s (`modes.park.GRANT_RESTART`" in text
    assert f"after {HELD_RESTART:g} s (`modes.held.HELD_RESTART`" in text
    assert f"every {SWEEP_INTERVAL:g} s or so" in text


def test_the_follow_up_figures_of_the_modes_page_are_the_code_s() -> None:
    """docs/modes.md quotes how long a hand-over is tried again, how long the handed call is
    kept, and the sweep's interval, from the code."""
    from celery_singleton_lock.engine.atomic import HANDED_KEEP_MS  # noqa: PLC0415
    from celery_singleton_lock.modes.followup import HAND_OVER_PATIENCE  # noqa: PLC0415
    from celery_singleton_lock.runtime.sweep import SWEEP_INTERVAL  # noqa: PLC0415

    text = " ".join((DOCS / "modes.md").read_text().split())
    assert f"for up to {HAND_OVER_PATIENCE:g} s (`modes.followup.HAND_OVER_PATIENCE`" in text
    assert f"for {HANDED_KEEP_MS // 60_000} minutes (`engine.atomic.HANDED_KEEP_MS`" in text
    assert f"parked calls every {SWEEP_INTERVAL:g} s)" in text


def test_observers_ask_the_policy_what_it_reports() -> None:
    """What the signals report as ``policy`` is every conflict policy's name and a debounced
    call's, each naming the policy (or mode) that says how observers read it: a span's
    outcome (None: a signal of its own ends the attempt, as ``lock_parked`` does, and every
    other outcome is a documented one), whether it waits, whether it fails the caller, and
    whether it keeps calls in the lock Redis."""
    from celery_singleton_lock import otel  # noqa: PLC0415 - the otel extra
    from celery_singleton_lock.modes import REPORTED  # noqa: PLC0415

    assert set(REPORTED) == {*opt.CONFLICT_POLICIES, "debounce"}
    read = {
        name: (kind.outcome, kind.waits, kind.fails_caller, getattr(kind, "keeps_calls", False))
        for name, kind in REPORTED.items()
    }
    assert read == {
        "skip": ("skipped", False, False, False),
        "retry": ("retried", False, False, False),
        "raise": ("raised", False, True, False),
        "wait": ("timed-out", True, True, False),
        "coalesce": (None, False, False, True),
        "replace": (None, False, False, True),
        "park": (None, False, False, True),
        "debounce": ("debounced", False, False, False),
    }
    assert {kind.outcome for kind in REPORTED.values()} - {None} <= set(otel.OUTCOMES)
    for name, policy in POLICIES.items():
        assert REPORTED[policy.reported] is type(policy), name
