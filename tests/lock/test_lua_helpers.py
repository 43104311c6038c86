"""The shared Lua helpers of the scripts (``engine/scripts/lib``) agree with their Python
twins on a real server: ``base`` with ``keyspace.base_key``, ``format_value`` with
``value.format_value``, and ``owned`` accepts exactly the owner's values."""

from __future__ import annotations

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_singleton_lock.engine.keyspace import base_key
from celery_singleton_lock.engine.scripts import include
from celery_singleton_lock.engine.value import MAX_EXACT, format_value, parse_value

BASE = include("base") + "\nreturn base(ARGV[1])"
FORMAT = (
    include("value")
    + "\nreturn format_value(tonumber(ARGV[1]), ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5])"
)
OWNED = (
    include("owner")
    + """
local flag, fence, info = owned(ARGV[1], ARGV[2])
if not flag then return false end
return {flag, fence, info}
"""
)

_names = st.text(alphabet=st.sampled_from("ab:{}é-"), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(name=_names)
def test_lua_base_is_base_key(client: redis.Redis, name: str) -> None:
    """For every name ``base_key`` accepts, the Lua ``base`` builds the same prefix."""
    try:
        expected = base_key(name)
    except ValueError:
        return  # RedisLock refuses the name: no script ever sees it
    assert client.eval(BASE, 0, name).decode() == expected


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(
    expiry=st.integers(0, MAX_EXACT),
    waiters=st.booleans(),
    token=st.text(alphabet="abcdef0123456789-", max_size=12),
    fence=st.integers(0, MAX_EXACT),
    info=st.text(max_size=20),
)
def test_lua_format_value_is_format_value(
    client: redis.Redis, expiry: int, waiters: bool, token: str, fence: int, info: str
) -> None:
    """The Lua builder writes byte for byte what Python writes, and it parses back."""
    flag = "1" if waiters else "0"
    written = client.eval(FORMAT, 0, expiry, flag, token, fence, info)
    assert written == format_value(expiry, waiters, token, fence, info).encode()
    assert parse_value(written).fence == fence


@pytest.mark.parametrize(
    ("value", "token", "expected"),
    [
        ('1700000000000:1:tok:42:{"a":1}', "tok", [b"1", b"42", b'{"a":1}']),
        ("1:0:tok:7:", "tok", [b"0", b"7", b""]),  # expired: still the owner's to release
        ("1700000000000:0:other:42:", "tok", None),
        ("1700000000000:0:tok:x:", "tok", None),  # not our layout
        ("1700000000", "tok", None),  # a classic timestamp has no owner
        ("1700000000000:0::42:", "", [b"0", b"42", b""]),
    ],
)
def test_owned_matches_only_the_owner(
    client: redis.Redis, value: str, token: str, expected: list[bytes] | None
) -> None:
    """``owned`` gives flag, fencing token and info for the owner token's value, else nil."""
    assert client.eval(OWNED, 0, value, token) == expected
