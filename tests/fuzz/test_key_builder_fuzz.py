"""A task's cached key builder (``key_builder.key_builder``) gives exactly the key of the general
``task_lock_key`` for every call: arguments of any type, positional or by name, missing,
extra or duplicated (calls that do not bind), under every ``lock_keys`` form and with a
stacked-limit tag."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_singleton_lock.key_builder import key_builder
from celery_singleton_lock.keys import task_lock_key

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(),
    st.binary(max_size=8),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.tuples(inner, inner),
        st.dictionaries(st.one_of(st.text(max_size=4), st.integers()), inner, max_size=3),
        st.frozensets(st.integers(), max_size=3),
    ),
    max_leaves=8,
)


def plain(a: Any, b: Any = 2, *, c: Any = None) -> None: ...


def required(a: Any, b: Any) -> None: ...


def varargs(a: Any, *rest: Any, **extra: Any) -> None: ...


def no_args() -> None: ...


FUNCS = [plain, required, varargs, no_args]
LOCK_KEYS: list[object] = [None, [], ["a"], ("b", "a"), ["a", "a"], ["c"], ["zz"], ("b",)]
names = st.sampled_from(["a", "b", "c", "d"])


@FUZZ
@given(
    func=st.sampled_from(FUNCS),
    lock_keys=st.sampled_from(LOCK_KEYS),
    args=st.lists(values, max_size=4),
    kwargs=st.dictionaries(names, values, max_size=3),
    tag=st.sampled_from([None, "tag1"]),
)
def test_builder_gives_the_general_key(
    func: Any, lock_keys: object, args: list[Any], kwargs: dict[str, Any], tag: str | None
) -> None:
    build = key_builder("csl", "proj.task", func, lock_keys, tag=tag)
    expected = task_lock_key("csl", "proj.task", func, tuple(args), kwargs, lock_keys, tag=tag)
    assert build(tuple(args), kwargs) == expected


def test_builder_sees_a_cycle_and_a_callable_lock_keys_as_the_general_path() -> None:
    loop: list[Any] = [1]
    loop.append(loop)
    build = key_builder("csl", "proj.task", plain, None)
    assert build((loop,), {}) == task_lock_key("csl", "proj.task", plain, (loop,), {}, None)

    def chooser(args: tuple[Any, ...], kwargs: dict[str, Any]) -> object:
        return {"first": args[0]}

    build = key_builder("csl", "proj.task", plain, chooser)
    assert build((5,), {}) == task_lock_key("csl", "proj.task", plain, (5,), {}, chooser)
