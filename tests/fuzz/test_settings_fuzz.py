"""Settings and options fuzzed with Hypothesis: any value of any ``singleton_lock_*``
setting, ``lock_*`` option or ``singleton_lock_tasks`` entry is either accepted, as the
documented value it stands for, or refused with ``ImproperlyConfigured`` naming it —
never another exception. The engine's own keywords likewise raise only ``ValueError``.

Numbers, flags and choices are checked against a model of the documented ranges (what
``docs/configuration.md`` lists), so a value the docs call malformed is never accepted.
"""

from __future__ import annotations

import datetime as dt
import fractions
import math
import numbers
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
import redis
from celery.exceptions import ImproperlyConfigured
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_singleton_lock import RedisLock
from celery_singleton_lock.config import read_settings
from celery_singleton_lock.options import (
    CONFLICT_POLICIES,
    MAX_DURATION,
    MIN_TIMEOUT,
    SCOPES,
    setting_names,
    task_option_names,
    validate_task_options,
)

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class Weird:
    """An object no setting should accept."""

    def __repr__(self) -> str:
        return "Weird()"


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**2000), max_value=2**2000),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([MIN_TIMEOUT, 0.4999, 0, -0.0, 1e-9, 2**63 - 1, 2**63, -1, 1]),
    st.fractions(),
    st.decimals(allow_nan=True, allow_infinity=True),
    st.complex_numbers(),
    st.text(max_size=30),
    st.sampled_from(["30", "false", "True", "skip ", "Queue", "", "csl", "redis://x:1/0"]),
    st.binary(max_size=10),
    st.dates(),
    st.timedeltas(),
    st.builds(Weird),
)
values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(st.text(max_size=12) | st.integers(), children, max_size=3),
        st.frozensets(st.integers(), max_size=3),
    ),
    max_leaves=8,
)


def _real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _float(value: Any) -> float:
    try:
        return float(value)
    except OverflowError:
        return math.nan


def _model(name: str, value: Any) -> Any:
    """What the docs say ``value`` means for option ``name`` (without its prefix), or the
    class ``ImproperlyConfigured`` when they call it malformed. ``...`` where the model does
    not judge (URLs, lock_keys, tasks: checked only for their error type)."""
    if name in ("timeout", "queue_timeout"):
        ok = _real(value) and MIN_TIMEOUT <= _float(value) <= MAX_DURATION
        return _float(value) if ok else ImproperlyConfigured
    if name == "wait":
        if value is None or (_real(value) and _float(value) == math.inf):
            return None
        ok = _real(value) and 0 <= _float(value) <= MAX_DURATION
        return _float(value) if ok else ImproperlyConfigured
    if name in ("retry_delay", "debounce", "debounce_max_wait"):
        if value is None:
            return None
        number = _float(value) if _real(value) else math.nan
        above = number >= 0 if name == "retry_delay" else number > 0
        return number if above and number <= MAX_DURATION else ImproperlyConfigured
    if name == "replicas":
        ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
        return int(value) if ok and 0 <= int(value) < 2**63 else ImproperlyConfigured
    if name in ("renew", "fail_open", "scripting"):
        return value if isinstance(value, bool) else ImproperlyConfigured
    if name == "on_conflict":
        ok = isinstance(value, str) and value in CONFLICT_POLICIES
        return value if ok else ImproperlyConfigured
    if name == "scope":
        ok = isinstance(value, str) and value in SCOPES
        return value if ok else ImproperlyConfigured
    if name == "prefix":
        ok = (
            isinstance(value, str)
            and value
            and not any(ch in "{}" or ch.isspace() or not ch.isprintable() for ch in value)
        )
        return value if ok else ImproperlyConfigured
    return ...


def _attempt(call: Callable[[], Any]) -> tuple[Any, str | None]:
    """(result, None) or (None, the message of the ImproperlyConfigured it raised)."""
    try:
        return call(), None
    except ImproperlyConfigured as exc:
        return None, str(exc)


def _same(got: Any, expected: Any) -> bool:
    if isinstance(expected, float) and isinstance(got, float):
        return got == expected
    return bool(got == expected) and type(got) is type(expected)


EDGES = (MIN_TIMEOUT, 0.4999, 0, 0.0, -0.0, 1e-9, -1, 1, 2**63 - 1, 2**63, math.inf, math.nan,
         MAX_DURATION, MAX_DURATION + 1e-6, 1e14)  # fmt: skip


@pytest.mark.parametrize("name", setting_names())
def test_edge_values_of_every_setting(name: str) -> None:
    """The boundary values of the documented ranges, for every setting, deterministically."""
    for value in EDGES:
        _check_setting(name, value)


@FUZZ
@given(name=st.sampled_from(setting_names()), value=values)
def test_every_setting_value_is_accepted_as_documented_or_refused(name: str, value: Any) -> None:
    """Any value of any setting: accepted exactly when the docs allow it (as the value they
    say), else ImproperlyConfigured whose message starts with the setting's name."""
    _check_setting(name, value)


def _check_setting(name: str, value: Any) -> None:
    field = name.removeprefix("singleton_lock_")
    expected = _model(field, value)
    parsed, error = _attempt(lambda: read_settings({name: value}))
    if error is not None:
        assert error.startswith(name), error
        assert expected is ImproperlyConfigured or expected is ..., (value, error)
        return
    assert expected is not ImproperlyConfigured, f"{name}={value!r} was accepted"
    if expected is not ...:
        assert _same(getattr(parsed, field), expected), (value, getattr(parsed, field))


@FUZZ
@given(name=st.sampled_from(task_option_names()), value=values)
def test_every_task_option_value_is_accepted_as_documented_or_refused(
    name: str, value: Any
) -> None:
    """Any value of any lock_* option (a task's, a call's or a glob entry's): accepted as
    documented or ImproperlyConfigured naming the option — and the same through
    singleton_lock_tasks (where None means "not set")."""
    field = name.removeprefix("lock_")
    # On a task, a call or a glob entry None means "not set" (use the setting).
    expected = ... if value is None else _model(field, value)
    for where, attempt in (
        ("task 'x': " + name, lambda: validate_task_options({name: value}, "task 'x'")),
        (
            f"singleton_lock_tasks['a.*']: {name}",
            lambda: read_settings({"singleton_lock_tasks": {"a.*": {name: value}}}),
        ),
    ):
        _, error = _attempt(attempt)
        if error is not None:
            assert error.startswith(where), error
            assert expected is ImproperlyConfigured or expected is ..., (value, error)
        else:
            assert expected is not ImproperlyConfigured, f"{name}={value!r} was accepted"


@FUZZ
@given(tasks=values)
def test_any_singleton_lock_tasks_structure_is_accepted_or_refused(tasks: Any) -> None:
    """Whatever structure singleton_lock_tasks holds, reading it either works or raises
    ImproperlyConfigured naming the setting."""
    _, error = _attempt(lambda: read_settings({"singleton_lock_tasks": tasks}))
    assert error is None or error.startswith("singleton_lock_tasks"), error


@FUZZ
@given(suffix=st.text(st.characters(codec="ascii", categories=["Ll", "Nd"]), min_size=1,
                      max_size=12), value=values)  # fmt: skip
def test_unknown_setting_names_are_refused(suffix: str, value: Any) -> None:
    """A singleton_lock_* name that is not a setting is ImproperlyConfigured, whatever its
    value."""
    name = "singleton_lock_" + suffix
    if name in setting_names():
        return
    with pytest.raises(ImproperlyConfigured, match="unknown setting"):
        read_settings({name: value})


ENGINE_KEYWORDS = ("timeout", "fallback_poll", "replicas", "replicas_timeout", "token", "claim")


@FUZZ
@given(keyword=st.sampled_from(ENGINE_KEYWORDS), value=values)
def test_engine_keywords_raise_only_value_error(keyword: str, value: Any) -> None:
    """RedisLock's keywords (and acquire's timeout) take any value without an exception
    other than ValueError; nothing is sent to Redis to find out."""
    client = redis.Redis(port=1)  # never connected: validation happens before any call
    try:
        lock = RedisLock(client, "fuzz:x", **{keyword: value})
    except ValueError:
        return
    assert lock.name == "fuzz:x"


@FUZZ
@given(value=values)
def test_acquire_timeout_raises_only_value_error(value: Any) -> None:
    """acquire(timeout=...) refuses every value that is not a number >= 0 or None with
    ValueError, before any call to Redis."""
    lock = RedisLock(redis.Redis(port=1, socket_connect_timeout=0.01), "fuzz:x")
    valid = value is None or (
        _real(value) and not isinstance(value, (fractions.Fraction, Decimal))
        and not (isinstance(value, float) and math.isnan(value)) and value >= 0
    )  # fmt: skip
    if valid:
        return  # would try to reach Redis
    with pytest.raises(ValueError, match="acquire timeout"):
        lock.acquire(timeout=value)


def test_huge_numbers_are_configuration_errors_not_overflow() -> None:
    """An int too big for a float as a duration is ImproperlyConfigured (it raised
    OverflowError before the fuzz found it), and a ValueError for the engine."""
    for name in ("singleton_lock_timeout", "singleton_lock_wait", "singleton_lock_retry_delay"):
        with pytest.raises(ImproperlyConfigured, match=name):
            read_settings({name: 10**400})
    with pytest.raises(ValueError, match="timeout"):
        RedisLock(redis.Redis(port=1), "x", timeout=10**400)
    assert dt.timedelta(seconds=1)  # keeps the import honest for the strategies above
