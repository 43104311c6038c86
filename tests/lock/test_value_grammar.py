"""One grammar for lock values: the Lua ``parse`` of the scripts and ``parse_value`` in
Python give the same verdict for any bytes at the key (a differential property test on a
real server), numbers stay exact (at most 2^53 - 1), and a fencing token at that limit is
a clear error, never a token that goes backwards."""

from __future__ import annotations

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_singleton_lock import LockError, RedisLock
from celery_singleton_lock.engine.scripts import include
from celery_singleton_lock.engine.value import MAX_EXACT, parse_value
from celery_singleton_lock.testing import RedisServer

VERDICT = (
    include("value")
    + """
local e, flag_at, fence, token = parse(ARGV[1])
if e == nil then return {'foreign'} end
if flag_at == nil then return {'classic', string.format('%.0f', e)} end
return {'ours', string.format('%.0f', e), string.format('%.0f', fence), token}
"""
)


def python_verdict(raw: bytes) -> list[str]:
    value = parse_value(raw)
    if value.expiry_ms is None:
        return ["foreign"]
    if value.classic:
        return ["classic", str(value.expiry_ms)]
    return ["ours", str(value.expiry_ms), str(value.fence), value.token or ""]


def lua_verdict(client: redis.Redis, raw: bytes) -> list[str]:
    reply = client.eval(VERDICT, 0, raw)
    return [part.decode("utf-8", "replace") for part in reply]


_digits = st.text(alphabet="0123456789", min_size=1, max_size=18)
_odd_digits = st.text(alphabet="0123456789٣৪１", min_size=1, max_size=18)  # Unicode digits too
_token = st.text(alphabet="abcdef0123456789-:\n", max_size=12)
_tail = st.sampled_from(["", "\n", " ", "\r\n", ":", "x"])


@st.composite
def near_values(draw: st.DrawFn) -> bytes:
    """Values that look like ours or like a classic timestamp, with the edge cases the
    two parsers used to disagree on."""
    number = draw(st.one_of(_digits, _odd_digits))
    kind = draw(st.sampled_from(["ours", "classic", "decimal"]))
    if kind == "ours":
        flag = draw(st.sampled_from(["0", "1", "2", ""]))
        fence = draw(st.one_of(_digits, _odd_digits))
        info = draw(st.text(max_size=20))
        text = f"{number}:{flag}:{draw(_token)}:{fence}:{info}"
    elif kind == "classic":
        text = number
    else:
        text = f"{number}.{draw(_digits)}"
    return (text + draw(_tail)).encode("utf-8")


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(raw=st.one_of(near_values(), st.binary(max_size=48)))
def test_lua_and_python_parse_alike(client: redis.Redis, raw: bytes) -> None:
    assert lua_verdict(client, raw) == python_verdict(raw)


def test_known_disagreements_are_gone(client: redis.Redis) -> None:
    for raw in [
        "١٧٠٠٠٠٠٠٠٠".encode(),  # Arabic-Indic digits: not a timestamp
        b"1700000000\n",  # a trailing newline: not a timestamp
        b"9" * 17,  # more digits than the grammar allows
        f"{MAX_EXACT + 1}".encode(),
        f"1800000000000:0:tok:{MAX_EXACT + 1}:".encode(),
        b"1800000000000:0:tok:12:info with\nnewline",
    ]:
        assert lua_verdict(client, raw) == python_verdict(raw), raw


def test_fencing_token_at_its_limit_is_a_clear_error(
    client: redis.Redis, key: str, scripting: bool
) -> None:
    """An expired hold whose fencing token is 2^53 - 1: taking it over would need a token
    that a double cannot hold exactly, so acquire raises instead of going backwards."""
    client.set(key, f"1:0:old:{MAX_EXACT}:", px=60_000)
    lock = RedisLock(client, key, timeout=5, scripting=scripting)
    with pytest.raises(LockError, match="limit"):
        lock.acquire(blocking=False)
    client.delete(key)


@pytest.mark.parametrize(
    "planted",
    [f"{MAX_EXACT}:0:someone:1:", "9" * 20 + ":0:someone:1:", "9" * 30 + ".5", "9" * 400],
    ids=["max-exact", "20-digits", "huge-decimal", "400-digits"],
)
def test_far_future_expiry_waits_with_bounded_commands(
    fresh_server: RedisServer, scripting: bool, planted: str
) -> None:
    """A planted expiry far in the future (with a TTL on the key): a waiter polls at the
    fallback period — a bounded number of commands (tens, where a busy poll made
    thousands) — and never overflows."""
    client = redis.Redis.from_url(fresh_server.url)
    client.set("far:{x}", planted, px=60_000)
    before = int(client.info("stats")["total_commands_processed"])
    lock = RedisLock(client, "far:{x}", timeout=5, scripting=scripting, fallback_poll=0.5)
    assert not lock.acquire(timeout=1.5)
    spent = int(client.info("stats")["total_commands_processed"]) - before
    assert spent < 100, spent  # a busy poll made thousands
    client.close()
