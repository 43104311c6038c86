"""The producer computes a queue-scope key from the arguments as the worker will read them:
the direct conversion of plain JSON values must equal the serializer's own round trip."""

from __future__ import annotations

import datetime
import enum
import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from kombu.serialization import dumps, loads

from celery_singleton_lock.runtime import wire_form


class _Color(str, enum.Enum):
    RED = "red"


class _Size(enum.IntEnum):
    LARGE = 3


_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text()
    | st.binary(max_size=8)
    | st.datetimes()
    | st.sampled_from(list(_Color))
    | st.sampled_from(list(_Size))
)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=5) | st.integers(), inner, max_size=4)
    ),
    max_leaves=12,
)


def _round_trip(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    content_type, encoding, body = dumps([list(args), kwargs], serializer="json")
    back = loads(body, content_type, encoding, accept={content_type})
    return tuple(back[0]), dict(back[1])


def _same(a: Any, b: Any) -> bool:
    """Equal, counting NaN equal to NaN and telling 1 from 1.0 and True from 1."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


@settings(max_examples=300, deadline=None)
@given(st.lists(_values, max_size=3), st.dictionaries(st.text(max_size=5), _values, max_size=3))
def test_json_arguments_read_as_the_worker_reads_them(
    args: list[Any], kwargs: dict[str, Any]
) -> None:
    """Whatever the arguments (nested, tuples, int dict keys, NaN, bytes, dates), wire_form
    under json gives exactly what kombu's json round trip gives, or the arguments as given
    when they do not serialize at all."""
    try:
        expected = _round_trip(tuple(args), kwargs)
    except Exception:  # not serializable: wire_form keeps them as given
        expected = (tuple(args), kwargs)
    assert _same(wire_form(args, kwargs, "json"), expected)


def test_tuples_become_lists_and_dates_take_the_round_trip() -> None:
    """A tuple is read back as a list; a date is read back as kombu's json makes it."""
    when = datetime.date(2026, 11, 24)
    args, kwargs = wire_form(((1, 2), when), {"k": (3,)}, "json")
    assert args == ([1, 2], _round_trip((when,), {})[0][0])
    assert kwargs == {"k": [3]}
