"""Unit and property tests for ``celery_singleton_lock.keys`` (pure: no Redis, no worker)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import hashlib
import json
import logging
import math
import re
import uuid
from collections import OrderedDict
from collections.abc import Callable, Hashable
from decimal import Decimal
from pathlib import PurePosixPath, PureWindowsPath
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from celery_singleton_lock.keys import (
    DIGEST_LENGTH,
    MAX_DEPTH,
    MAX_TASK_NAME_LENGTH,
    bind_arguments,
    canonical_json,
    check_lock_keys,
    readable_task_name,
    task_lock_key,
)

KEY_RE = re.compile(r"^(?P<prefix>[^:]+):(?P<name>.*):\{(?P<digest>[0-9a-f]{32})\}$", re.DOTALL)


def sample(a: Any, b: Any = 2, *rest: Any, c: Any = 3, **extra: Any) -> None:
    """A task body with every kind of parameter."""


def buy(sku: str, user_id: int, qty: int = 1) -> None:
    """A task body with plain parameters."""


def anything(*args: Any, **kwargs: Any) -> None:
    """A task body accepting any arguments."""


def key_of(*args: Any, **kwargs: Any) -> str:
    """The key of ``anything(*args, **kwargs)`` with every argument counted."""
    return task_lock_key("csl", "t.anything", anything, args, kwargs)


def value_key(value: Any) -> str:
    """The key of a call whose single argument is ``value``."""
    return task_lock_key("csl", "t.one", buy, (value, 1), {})


# ----------------------------------------------------------------- odd objects


class NoEq:
    """Plain object with identity equality and no canonical form."""


class RaisingRepr:
    """An object whose repr and str blow up."""

    def __repr__(self) -> str:
        raise RuntimeError("no repr")

    __str__ = __repr__


class RaisingEverything:
    """An object whose comparisons, hash and attribute access all raise."""

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("no eq")

    def __hash__(self) -> int:
        raise RuntimeError("no hash")

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"no {name}")


class AnyAttribute:
    """An object that claims to have every attribute (like a mock)."""

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: self


class RaisingLockKey:
    """An object whose ``__lock_key__`` raises."""

    def __lock_key__(self) -> str:
        raise ValueError("broken hook")


class SelfLockKey:
    """An object whose ``__lock_key__`` returns itself."""

    def __lock_key__(self) -> object:
        return self


class EndlessLockKey:
    """An object whose ``__lock_key__`` returns a new instance every time."""

    def __lock_key__(self) -> object:
        return EndlessLockKey()


class Account:
    """An object with a stable identity through ``__lock_key__``."""

    def __init__(self, number: int) -> None:
        self.number = number

    def __lock_key__(self) -> int:
        return self.number


class FakeModel:
    """A pydantic-style object exposing ``model_dump()``."""

    def __init__(self, **fields: Any) -> None:
        self.fields = fields

    def model_dump(self) -> dict[str, Any]:
        return dict(self.fields)


class RaisingModel:
    """A pydantic-style object whose ``model_dump()`` raises."""

    def model_dump(self) -> dict[str, Any]:
        raise TypeError("cannot dump")


class Color(enum.Enum):
    RED = 1
    BLUE = 2


class Shade(enum.Enum):
    RED = 1


class Level(enum.IntEnum):
    ONE = 1


@dataclasses.dataclass
class Point:
    x: int
    y: list[int]
    note: str = dataclasses.field(default="", compare=False)


def self_list() -> list[Any]:
    """A list containing itself."""
    items: list[Any] = [1]
    items.append(items)
    return items


def self_dict() -> dict[str, Any]:
    """A dict containing itself."""
    mapping: dict[str, Any] = {"a": 1}
    mapping["self"] = mapping
    return mapping


def mutual() -> list[Any]:
    """Two lists containing each other, reached through a tuple."""
    first: list[Any] = []
    second: list[Any] = [first]
    first.append((second,))
    return first


ODD_FACTORIES: list[Callable[[], Any]] = [
    NoEq,
    RaisingRepr,
    RaisingEverything,
    AnyAttribute,
    RaisingLockKey,
    SelfLockKey,
    EndlessLockKey,
    RaisingModel,
    self_list,
    self_dict,
    mutual,
    object,
    lambda: lambda: None,
    lambda: NoEq,
    lambda: iter([1, 2]),
    lambda: range(10**12),
    lambda: 10**5000,
    lambda: Decimal("sNaN"),
    lambda: float("nan"),
    lambda: dt.datetime.max.replace(tzinfo=dt.timezone(dt.timedelta(hours=-5))),
    lambda: "\ud800 lone surrogate",
    lambda: memoryview(b"abc"),
    lambda: PureWindowsPath("C:/x"),
    lambda: complex(1, float("inf")),
]

odd_objects = st.sampled_from(ODD_FACTORIES).map(lambda factory: factory())
odd_values = st.recursive(
    odd_objects | st.none() | st.integers(),
    lambda children: (
        st.lists(children, max_size=4)
        | st.tuples(children, children)
        | st.dictionaries(st.text(alphabet="abc", max_size=3), children, max_size=3)
    ),
    max_leaves=12,
)


# ---------------------------------------------------------------- value oracle

aware_tz = st.builds(
    dt.timezone,
    st.timedeltas(min_value=dt.timedelta(hours=-23), max_value=dt.timedelta(hours=23)).map(
        lambda delta: dt.timedelta(minutes=delta // dt.timedelta(minutes=1))
    ),
)
datetimes = st.datetimes(
    min_value=dt.datetime(2, 1, 1), max_value=dt.datetime(9998, 12, 31)
) | st.datetimes(
    min_value=dt.datetime(2, 1, 1), max_value=dt.datetime(9998, 12, 31), timezones=aware_tz
)
hashable_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.text(max_size=8)
    | st.binary(max_size=8)
    | st.uuids()
    | st.decimals(allow_nan=False, places=None)
)
scalars = (
    hashable_scalars
    | st.floats()
    | st.dates()
    | st.times()
    | datetimes
    | st.sampled_from([Color.RED, Color.BLUE, Shade.RED, Level.ONE])
)
json_like = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.lists(children, max_size=4).map(tuple)
        | st.dictionaries(
            st.text(max_size=4) | st.integers(-3, 3) | st.booleans(), children, max_size=4
        )
        | st.frozensets(hashable_scalars, max_size=4)
        | st.sets(hashable_scalars, max_size=4)
    ),
    max_leaves=16,
)


def norm(value: Any) -> Hashable:
    """An independent model of "the same argument": equal exactly when keys must be."""
    if value is None:
        return ("none",)
    if isinstance(value, enum.Enum):
        return ("enum", type(value), norm(value.value))
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int):
        return ("int", value)
    if isinstance(value, float):
        return ("float", "nan") if math.isnan(value) else ("float", value)
    if isinstance(value, str):
        return ("str", value)
    if isinstance(value, (bytes, bytearray)):
        return ("bytes", bytes(value))
    if isinstance(value, Decimal):
        return ("decimal", value)
    if isinstance(value, dt.datetime):
        return ("datetime", value.tzinfo is not None, value)
    if isinstance(value, dt.date):
        return ("date", value)
    if isinstance(value, dt.time):
        return ("time", value)
    if isinstance(value, uuid.UUID):
        return ("uuid", value)
    if isinstance(value, (list, tuple)):
        return ("list", tuple(norm(item) for item in value))
    if isinstance(value, dict):
        return ("dict", frozenset((norm(k), norm(v)) for k, v in value.items()))
    if isinstance(value, (set, frozenset)):
        return ("set", frozenset(norm(item) for item in value))
    raise AssertionError(f"no model for {type(value)}")


def swap_containers(value: Any) -> Any:
    """The same value with lists and tuples swapped and dict insertion order reversed."""
    if isinstance(value, list):
        return tuple(swap_containers(item) for item in value)
    if isinstance(value, tuple):
        return [swap_containers(item) for item in value]
    if isinstance(value, dict):
        return {k: swap_containers(v) for k, v in reversed(list(value.items()))}
    if isinstance(value, set):
        return frozenset(value)
    if isinstance(value, frozenset):
        return set(value)
    return value


# ------------------------------------------------------------------ properties


@given(json_like)
def test_key_is_deterministic(value: Any) -> None:
    """The same arguments always map to the same key and the same canonical text."""
    assert value_key(value) == value_key(value)
    assert canonical_json(value) == canonical_json(value)


@given(json_like)
def test_container_spelling_does_not_change_the_key(value: Any) -> None:
    """Tuples vs lists, dict insertion order and set vs frozenset never change the key."""
    assert value_key(swap_containers(value)) == value_key(value)


@given(json_like, json_like)
@example(True, 1)
@example(1, 1.0)
@example(0.0, -0.0)
@example(Decimal("1.50"), Decimal("1.5"))
@example(Decimal("0"), Decimal("-0.00"))
@example((1, 2), [1, 2])
@example({1: "x"}, {"1": "x"})
@example(b"x", "x")
@example(Color.RED, Shade.RED)
@example(Level.ONE, 1)
@example({1, 2}, [1, 2])
@example(
    dt.datetime(2024, 1, 1, 12, tzinfo=dt.timezone(dt.timedelta(hours=2))),
    dt.datetime(2024, 1, 1, 10, tzinfo=dt.timezone.utc),
)
@example(dt.datetime(2024, 1, 1, 10), dt.datetime(2024, 1, 1, 10, tzinfo=dt.timezone.utc))
@example(dt.datetime(2024, 1, 1), dt.date(2024, 1, 1))
@example(float("nan"), float("nan"))
@example(float("inf"), "inf")
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_keys_are_equal_exactly_when_values_are_canonically_equal(first: Any, second: Any) -> None:
    """Two argument values share a key if and only if the value model calls them equal."""
    assert (value_key(first) == value_key(second)) == (norm(first) == norm(second))


@given(
    st.tuples(st.integers(), st.integers() | st.text(max_size=3), st.integers()),
    st.data(),
)
def test_equal_by_binding_calls_share_a_key(
    values: tuple[Any, Any, Any], data: st.DataObject
) -> None:
    """Any positional/keyword spelling of the same bound call gives the same key."""
    a, b, c = values
    spellings: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        ((a, b), {"c": c}),
        ((a,), {"b": b, "c": c}),
        ((), {"a": a, "b": b, "c": c}),
        ((), {"c": c, "b": b, "a": a}),
    ]
    args, kwargs = data.draw(st.sampled_from(spellings))
    reference = task_lock_key("csl", "t.sample", sample, (a, b), {"c": c})
    assert task_lock_key("csl", "t.sample", sample, args, kwargs) == reference


@given(
    st.text(max_size=400),
    st.lists(st.text(min_size=50, max_size=200) | st.binary(max_size=500), max_size=60),
)
def test_key_length_is_bounded(task_name: str, payload: list[Any]) -> None:
    """Whatever the task name and arguments, the key stays within a fixed length."""
    key = task_lock_key("csl", task_name, anything, payload, {"more": payload})
    assert len(key) <= len("csl") + 1 + MAX_TASK_NAME_LENGTH + 1 + DIGEST_LENGTH + 2
    match = KEY_RE.match(key)
    assert match is not None
    assert match["name"] == readable_task_name(task_name)
    assert not any(ch.isspace() or ch in "{}" for ch in match["name"])
    key.encode("utf-8")  # redis-py must be able to send it


@given(odd_values)
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_odd_objects_never_raise(value: Any) -> None:
    """Objects without a canonical form, broken hooks and cycles never make encoding fail."""
    text = canonical_json(value)
    assert text == canonical_json(value)
    assert "0x" not in text
    assert value_key(value) == value_key(value)


# --------------------------------------------------------------- canonical form


def test_bool_int_and_float_are_distinct() -> None:
    """True, 1 and 1.0 are three different keys, as they are three different JSON values."""
    assert len({value_key(True), value_key(1), value_key(1.0)}) == 3


def test_tuples_and_lists_are_the_same() -> None:
    """A tuple argument has the key of the list Celery's JSON serializer turns it into."""
    assert value_key((1, (2, 3))) == value_key([1, [2, 3]])


def test_dict_order_does_not_matter_but_key_types_do() -> None:
    """Dict keys are sorted, and an int key differs from its string spelling."""
    assert value_key({"a": 1, "b": 2}) == value_key(OrderedDict([("b", 2), ("a", 1)]))
    assert value_key({1: "x"}) != value_key({"1": "x"})


def test_decimal_is_normalised() -> None:
    """Equal Decimals written with different exponents share a key."""
    assert value_key(Decimal("1.50")) == value_key(Decimal("1.5"))
    assert value_key(Decimal("100")) == value_key(Decimal("1E+2"))
    assert value_key(Decimal("1.5")) != value_key(1.5)


def test_aware_datetimes_are_compared_in_utc() -> None:
    """One instant written in two time zones is one key; a naive datetime is another."""
    paris = dt.datetime(2024, 6, 1, 14, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    utc = dt.datetime(2024, 6, 1, 12, tzinfo=dt.timezone.utc)
    assert value_key(paris) == value_key(utc)
    assert value_key(utc.replace(tzinfo=None)) != value_key(utc)


def test_sets_are_order_independent_and_differ_from_lists() -> None:
    """Sets are sorted by canonical text, and a set is not the list of its elements."""
    assert value_key({3, 1, 2}) == value_key(frozenset([2, 3, 1]))
    assert value_key({1, 2}) != value_key([1, 2])


def test_bytes_are_tagged() -> None:
    """bytes and bytearray of the same content agree and differ from the text."""
    assert value_key(b"abc") == value_key(bytearray(b"abc"))
    assert value_key(b"abc") != value_key("abc")
    assert '"$bytes":"YWJj"' in canonical_json(b"abc")


def test_uuid_enum_and_dataclass_forms() -> None:
    """UUIDs, enum members and dataclasses have readable tagged forms."""
    ident = uuid.UUID("12345678-1234-5678-1234-567812345678")
    assert canonical_json(ident) == '{"$uuid":"12345678-1234-5678-1234-567812345678"}'
    assert value_key(ident) != value_key(str(ident))
    assert value_key(Color.RED) != value_key(Shade.RED)
    assert value_key(Level.ONE) != value_key(1)
    assert value_key(Point(1, [2], note="a")) == value_key(Point(1, [2], note="b"))
    assert value_key(Point(1, [2])) != value_key(Point(1, [3]))
    assert value_key(Point(1, [2])) != value_key({"x": 1, "y": [2]})


def test_special_floats_are_tagged() -> None:
    """NaN and the infinities have stable tagged forms, and -0.0 equals 0.0."""
    assert canonical_json(float("nan")) == '{"$float":"nan"}'
    assert canonical_json([float("inf"), float("-inf")]) == '[{"$float":"inf"},{"$float":"-inf"}]'
    assert canonical_json(-0.0) == canonical_json(0.0)


def test_huge_ints_do_not_hit_the_digit_limit() -> None:
    """Ints beyond Python's int-to-str digit limit still encode, distinctly."""
    assert value_key(10**5000) != value_key(10**5000 + 1)


def test_other_known_types() -> None:
    """timedelta, complex and paths have canonical forms of their own."""
    assert value_key(dt.timedelta(days=1)) == value_key(dt.timedelta(hours=24))
    assert value_key(complex(1, 2)) != value_key(complex(2, 1))
    assert value_key(PurePosixPath("/a")) != value_key(PurePosixPath("/b"))
    assert value_key(PurePosixPath("/a")) != value_key("/a")


def test_lock_key_hook_is_used() -> None:
    """An object defining ``__lock_key__`` is identified by what it returns."""
    assert value_key(Account(1)) == value_key(Account(1))
    assert value_key(Account(1)) != value_key(Account(2))


def test_model_dump_is_used() -> None:
    """A pydantic-style object is identified by its ``model_dump()``."""
    assert value_key(FakeModel(a=1)) == value_key(FakeModel(a=1))
    assert value_key(FakeModel(a=1)) != value_key(FakeModel(a=2))


def test_unknown_objects_contribute_only_their_class(caplog: pytest.LogCaptureFixture) -> None:
    """Objects with no canonical form share a key per class and log one warning per class."""

    class Opaque:
        pass

    caplog.set_level(logging.WARNING, logger="celery_singleton_lock.keys")
    assert value_key(Opaque()) == value_key(Opaque())
    assert value_key(Opaque()) != value_key(NoEq())
    assert "0x" not in canonical_json(Opaque())
    assert "Opaque" in canonical_json(Opaque())
    warnings = [r for r in caplog.records if "Opaque" in r.getMessage()]
    assert len(warnings) == 1
    assert warnings[0].levelno == logging.WARNING


def test_broken_hooks_fall_back_to_the_class_name() -> None:
    """A raising ``__lock_key__`` or ``model_dump`` falls back to the safe rule, never raises."""
    assert canonical_json(RaisingLockKey()) == canonical_json(RaisingLockKey())
    assert "RaisingLockKey" in canonical_json(RaisingLockKey())
    assert "RaisingModel" in canonical_json(RaisingModel())


def test_cycles_are_marked() -> None:
    """Self-referencing lists and dicts encode with a cycle marker instead of recursing."""
    assert canonical_json(self_list()) == '[1,{"$cycle":1}]'
    assert '"$cycle"' in canonical_json(self_dict())
    assert '"$cycle"' in canonical_json(mutual())
    assert value_key(self_list()) != value_key([1, []])


def test_shared_references_are_not_cycles() -> None:
    """The same object appearing twice side by side is written twice, not as a cycle."""
    shared = [1, 2]
    assert canonical_json([shared, shared]) == "[[1,2],[1,2]]"


def test_deep_nesting_is_cut_off_not_fatal() -> None:
    """Nesting far beyond the depth limit encodes without RecursionError."""
    value: list[Any] = []
    for _ in range(MAX_DEPTH * 50):
        value = [value]
    text = canonical_json(value)
    assert '"$deep"' in text
    assert text == canonical_json(value)


def test_injection_through_values_is_impossible() -> None:
    """Separators inside values cannot make two different argument sets collide."""
    assert key_of(a="x_b-1") != key_of(a="x", b=1)
    assert key_of("a:b") != key_of("a", "b")
    assert key_of("a,b") != key_of("a", "b")
    assert key_of('a","b') != key_of("a", "b")
    assert key_of({"s:a": 1}) != key_of(a=1)


def test_canonical_json_is_valid_json() -> None:
    """The canonical text parses as JSON, so it can be logged and inspected."""
    text = canonical_json({"a": [1, (2, 3)], 4: {5}, "b": b"x", "c": Decimal("1.0")})
    assert isinstance(json.loads(text), dict)


# ------------------------------------------------------------------- binding


def test_binding_applies_defaults_and_names_var_parameters() -> None:
    """Binding fills defaults, and *args/**kwargs land under their parameter names."""
    assert bind_arguments(sample, (1,), {}) == {"a": 1, "b": 2, "rest": [], "c": 3, "extra": {}}
    assert bind_arguments(sample, (1, 2, 9), {"z": 0}) == {
        "a": 1,
        "b": 2,
        "rest": [9],
        "c": 3,
        "extra": {"z": 0},
    }


def test_positional_and_keyword_spellings_bind_alike() -> None:
    """f(1, b=2), f(1, 2), f(a=1, b=2) and f(1) (default b=2) are one key."""
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        ((1,), {"b": 2}),
        ((1, 2), {}),
        ((), {"a": 1, "b": 2}),
        ((1,), {}),
    ]
    found = {task_lock_key("csl", "t.sample", sample, args, kwargs) for args, kwargs in calls}
    assert len(found) == 1


def test_binding_failure_falls_back_without_raising() -> None:
    """Arguments that do not fit the signature bind to the raw *args/**kwargs form."""
    assert bind_arguments(buy, (1, 2, 3, 4), {"nope": 5}) == {
        "*args": [1, 2, 3, 4],
        "**kwargs": {"nope": 5},
    }
    assert task_lock_key("csl", "t.buy", buy, (), {"nope": 5}).startswith("csl:t.buy:{")


def test_callables_without_signature_are_bound_raw() -> None:
    """A builtin with no introspectable signature still yields a key."""
    assert bind_arguments(max, (1, 2), {}) == {"*args": [1, 2], "**kwargs": {}}


def test_bound_methods_exclude_self() -> None:
    """A bound method binds without its instance."""

    class Holder:
        def run(self, x: int, y: int = 0) -> None:
            """A method body."""

    assert bind_arguments(Holder().run, (1,), {}) == {"x": 1, "y": 0}


# ------------------------------------------------------------------ lock_keys


def test_lock_keys_selects_named_arguments() -> None:
    """With lock_keys=["sku"], calls differing in other arguments share a key."""
    first = task_lock_key("csl", "shop.buy", buy, ("sku-1", 7), {}, ["sku"])
    assert first == task_lock_key(
        "csl", "shop.buy", buy, (), {"sku": "sku-1", "user_id": 8}, ["sku"]
    )
    assert first != task_lock_key("csl", "shop.buy", buy, ("sku-2", 7), {}, ["sku"])
    assert task_lock_key("csl", "shop.buy", buy, ("s", 1), {}, ("sku",)) == task_lock_key(
        "csl", "shop.buy", buy, ("s", 1), {}, ["sku"]
    )


def test_lock_keys_reach_into_var_keyword_arguments() -> None:
    """A lock_keys name collected by **kwargs selects that keyword argument."""
    first = task_lock_key("csl", "t.anything", anything, (1,), {"sku": "a", "n": 1}, ["sku"])
    assert first == task_lock_key("csl", "t.anything", anything, (2,), {"sku": "a"}, ["sku"])
    assert first != task_lock_key("csl", "t.anything", anything, (), {"sku": "b"}, ["sku"])
    unfit = task_lock_key("csl", "t.buy", buy, (), {"sku": "a", "bad": 1}, ["sku"])
    assert unfit == task_lock_key("csl", "t.buy", buy, (), {"sku": "a", "bad": 2}, ["sku"])


def test_lock_keys_missing_name_is_distinct_from_none() -> None:
    """A named argument absent under **kwargs differs from passing it as None."""
    missing = task_lock_key("csl", "t.anything", anything, (), {}, ["sku"])
    given_none = task_lock_key("csl", "t.anything", anything, (), {"sku": None}, ["sku"])
    assert missing != given_none
    assert '"$missing"' not in canonical_json(None)


def test_empty_lock_keys_means_task_name_only() -> None:
    """lock_keys=() gives one key per task, whatever the arguments."""
    first = task_lock_key("csl", "shop.buy", buy, ("a", 1), {}, ())
    assert first == task_lock_key("csl", "shop.buy", buy, ("b", 2), {"qty": 3}, [])
    assert first != task_lock_key("csl", "shop.sell", buy, ("a", 1), {}, ())


def test_callable_lock_keys_receives_raw_arguments() -> None:
    """A callable lock_keys gets (args tuple, kwargs dict) and its string is hashed."""
    seen: list[tuple[Any, Any]] = []

    def chooser(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        seen.append((args, kwargs))
        return str(args[0]).lower()

    first = task_lock_key("csl", "shop.buy", buy, ["SKU", 1], {"qty": 2}, chooser)
    assert seen == [(("SKU", 1), {"qty": 2})]
    assert first == task_lock_key("csl", "shop.buy", buy, ("sku", 9), {}, chooser)


def test_callable_lock_keys_non_str_result_is_canonicalised() -> None:
    """A callable returning a non-str value is hashed through canonical JSON."""

    def chooser(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return {"sku": args[0]}

    assert task_lock_key("csl", "t", buy, ("a", 1), {}, chooser) != task_lock_key(
        "csl", "t", buy, ("b", 1), {}, chooser
    )


def test_callable_lock_keys_errors_propagate() -> None:
    """An exception in the user's lock_keys callable reaches the caller unchanged."""

    def chooser(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        raise KeyError("user bug")

    with pytest.raises(KeyError, match="user bug"):
        task_lock_key("csl", "t", buy, ("a", 1), {}, chooser)


def test_check_lock_keys_accepts_valid_forms() -> None:
    """None, callables, known names, empty tuples and any name under **kwargs pass."""
    check_lock_keys(buy, None)
    check_lock_keys(buy, lambda args, kwargs: "x")
    check_lock_keys(buy, ["sku", "qty"])
    check_lock_keys(buy, ())
    check_lock_keys(anything, ["whatever"])
    check_lock_keys(max, ["unknowable"])


def test_check_lock_keys_lists_unknown_names() -> None:
    """Names that are not parameters are listed in the error."""
    with pytest.raises(ValueError, match=r"\['skux', 'userid'\]"):
        check_lock_keys(buy, ["sku", "skux", "userid"])


@pytest.mark.parametrize("bad", ["sku", {"sku"}, {"sku": 1}, 42, ["sku", 1]])
def test_check_lock_keys_rejects_other_shapes(bad: object) -> None:
    """A bare string, a set, a dict, a number or non-str names are refused with ValueError."""
    with pytest.raises(ValueError, match="lock_keys"):
        check_lock_keys(buy, bad)


# ------------------------------------------------------------------ key shape


def test_key_shape() -> None:
    """A key is prefix, readable task name and a 32-hex digest in braces (the hash tag)."""
    key = task_lock_key("myapp", "shop.buy", buy, ("a", 1), {})
    match = KEY_RE.match(key)
    assert match is not None
    assert (match["prefix"], match["name"]) == ("myapp", "shop.buy")
    assert len(match["digest"]) == DIGEST_LENGTH
    assert key.count("{") == key.count("}") == 1


def test_task_name_is_made_readable() -> None:
    """Braces, whitespace and control characters in a task name become underscores."""
    assert readable_task_name("a{b} c\n\x00d\u200be") == "a_b__c__d_e"
    assert readable_task_name("x" * 500) == "x" * MAX_TASK_NAME_LENGTH


def test_long_task_names_with_a_common_start_differ() -> None:
    """The digest covers the full task name, so truncation cannot merge two tasks."""
    base = "t." + "x" * 200
    assert task_lock_key("csl", base + "1", buy, ("a", 1), {}) != task_lock_key(
        "csl", base + "2", buy, ("a", 1), {}
    )


def test_sanitised_task_names_still_differ() -> None:
    """Two task names that read alike after sanitising still get different digests."""
    assert task_lock_key("csl", "a b", buy, ("a", 1), {}) != task_lock_key(
        "csl", "a_b", buy, ("a", 1), {}
    )


def test_key_is_stable_across_releases() -> None:
    """The key format is pinned, so an upgrade does not split locks held by older workers."""
    assert canonical_json({"sku": "s", "user_id": 1, "qty": 1}) == (
        '{"s:qty":1,"s:sku":"s","s:user_id":1}'
    )
    assert task_lock_key("csl", "shop.buy", buy, ("s", 1), {}) == (
        "csl:shop.buy:{"
        + hashlib.sha256(b'"shop.buy"\n{"s:qty":1,"s:sku":"s","s:user_id":1}').hexdigest()[
            :DIGEST_LENGTH
        ]
        + "}"
    )
