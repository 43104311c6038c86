"""lock_limits and lock_weight without a server: templates checked and rendered, odd
arguments never breaking a name, weights of a callable checked, the options validated with
ImproperlyConfigured naming them, the combinations not supported (yet) refused, and the
stacked key carrying the app's stack tag."""

from __future__ import annotations

import datetime
import json
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import ImproperlyConfigured

from celery_singleton_lock import LockedTask
from celery_singleton_lock.engine.keyspace import base_key, split_key
from celery_singleton_lock.engine.stack import MAX_NAME, Stack, hash_tag, is_stacked, stack_base
from celery_singleton_lock.options import validate_task_options
from celery_singleton_lock.runtime.locking import locking_for
from celery_singleton_lock.stacking import call_stack, parse_limits, render_limit, template_fields


def export(report: str, tenant: Any, size: int = 1) -> None:
    """A task body with the parameters the templates read."""


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("tenant:{tenant}", "list of"),
        ([("a", 1, 2)], "pair"),
        ([("", 1)], "non-empty"),
        ([("a b", 1)], "whitespace"),
        ([("a", -1)], ">= 0"),
        ([("a", True)], ">= 0"),
        ([("a", 1.5)], ">= 0"),
        ([("a:{x.y}", 1)], "plain parameter names"),
        ([("a:{x!r}", 1)], "plain parameter names"),
        ([("a:{}", 1)], "plain parameter names"),
        ([("a", 1), ("a", 2)], "twice"),
        ([("x" * (MAX_NAME + 1), 1)], "longer"),
    ],
)
def test_bad_limits_say_what_is_wrong(value: object, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_limits(value)


def test_templates_read_plain_names() -> None:
    assert template_fields("tenant:{tenant}:{report}") == ("tenant", "report")
    assert template_fields("global:exports") == ()
    assert parse_limits([["t:{a}", 3], ("g", 0)]) == (("t:{a}", 3), ("g", 0))


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("acme", "acme"),
        (42, "42"),
        ("Ünïcode", None),
        ("with space", None),
        ("a:b", None),  # a ':' never splits a name ambiguously
        ("{tag}", None),
        ("x" * 100, None),
        ({"id": 1}, None),
        ([1, 2], None),
        (None, None),
        (True, None),  # not "true": the string "true" is another tenant
        (2.5, None),
        (datetime.date(2026, 1, 1), None),
    ],
)
def test_odd_arguments_render_safely(value: object, shown: str | None) -> None:
    """A short plain str or int shows as itself; anything else as a digest: the name has
    no whitespace, brace or ':' of the value's, and equal values give equal names."""
    name = render_limit("tenant:{tenant}", {"tenant": value})
    if shown is not None:
        assert name == f"tenant:{shown}"
    else:
        rest = name.removeprefix("tenant:")
        assert rest.startswith("#")
        assert not any(ch in rest for ch in " {}:")
        assert render_limit("tenant:{tenant}", {"tenant": value}) == name
    assert render_limit("tenant:{tenant}", {}) == "tenant:#missing"


def test_the_stack_of_a_call() -> None:
    """Bound arguments (positional or keyword alike), the weight callable called with them,
    two templates rendering one name keep the smaller number."""
    weight = lambda report, tenant, size: 1 + size // 100  # noqa: E731
    one = call_stack(
        "csl", export, (("t:{tenant}", 5), ("all", 50)), weight, ("r", "acme"), {"size": 250}
    )
    two = call_stack(
        "csl",
        export,
        (("t:{tenant}", 5), ("all", 50)),
        weight,
        (),
        {"report": "r", "tenant": "acme", "size": 250},
    )
    assert one == two
    assert one.weight == 3
    assert [(limit.name, limit.number) for limit in one.limits] == [("t:acme", 5), ("all", 50)]
    same = call_stack("csl", export, (("a:{tenant}", 5), ("a:{report}", 2)), 1, ("x", "x"), {})
    assert [(limit.name, limit.number) for limit in same.limits] == [("a:x", 2)]
    spec = json.loads(one.spec())
    assert spec["w"] == 3
    assert spec["c"] == "csl:{csl:stack}:limits"
    assert spec["l"][0][:4] == ["csl:{csl:stack}:limit:t:acme", "t:acme", "t:{tenant}", 5]
    for bad in (0, -1, True, 1.5, "2", None):
        with pytest.raises(ValueError, match="lock_weight"):
            call_stack("csl", export, (("all", 1),), lambda bad=bad, **_: bad, ("r", "t"), {})


def test_every_stack_key_shares_the_apps_tag() -> None:
    base = stack_base("csl")
    assert hash_tag(base + "limit:tenant:{x}") == "csl:stack"
    assert is_stacked("csl:proj.export:abc:{csl:stack}")
    assert not is_stacked("csl:proj.export:{abc}")
    with pytest.raises(ValueError, match="braces"):
        stack_base("a{b")
    with pytest.raises(ValueError, match="at least one"):
        Stack(base, ())


@pytest.fixture
def app() -> Celery:
    return Celery("limits_unit", broker="memory://", set_as_current=False)


def test_a_stacked_tasks_key_carries_the_tag(app: Celery) -> None:
    """The key of a task with lock_limits carries the stack's tag (its companions too), and
    the usual key of the same task without them does not."""

    @app.task(base=LockedTask, lock_keys=["report"], lock_limits=[("t:{tenant}", 2)], shared=False)
    def stacked(report: str, tenant: str) -> None: ...

    key = stacked.lock_key("r1", "acme")
    assert key.endswith(":{csl:stack}")
    assert hash_tag(key) == "csl:stack"
    assert base_key(key) == key + ":"
    assert split_key(key + ":queue") == (key, "queue")
    assert stacked.lock_key("r1", "other") == key  # the key is the report's only


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"lock_limits": [("t:{nope}", 2)]}, "lock_limits of task"),
        (
            {"lock_limits": [("t", 2)], "lock_on_conflict": "park", "lock_order": "enqueue"},
            "lock_order",
        ),
        ({"lock_limits": [("t", 2)], "lock_release": "success", "lock_hold": 1}, "lock_release"),
        ({"lock_weight": 2}, "lock_weight needs lock_limits"),
    ],
)
def test_bad_combinations_are_refused_by_name(
    app: Celery, options: dict[str, Any], error: str
) -> None:
    @app.task(base=LockedTask, shared=False, name=f"t{abs(hash(error))}", **options)
    def task(report: str, tenant: str) -> None: ...

    with pytest.raises(ImproperlyConfigured, match=error):
        locking_for(app.tasks[task.name])


def test_option_values_are_checked() -> None:
    with pytest.raises(ImproperlyConfigured, match="lock_limits"):
        validate_task_options({"lock_limits": "tenant"}, "task 'x'")
    with pytest.raises(ImproperlyConfigured, match="lock_weight"):
        validate_task_options({"lock_weight": 0}, "task 'x'")
    assert validate_task_options({"lock_weight": 3}, "task 'x'") == {"lock_weight": 3}
    with pytest.raises(ImproperlyConfigured, match="are lock_limits"):
        validate_task_options({"lock_limit": [("tenant:{t}", 5)]}, "task 'x'")
