"""Lock values planted by anyone, fuzzed with Hypothesis on a real redis-server, in both
protocol modes: every Redis type at the lock key (and at its waiters' queue), garbage
bytes, classic timestamps negative, huge, in seconds or milliseconds, our own layout with
nonsense in every field, with and without a TTL.

Whatever is there, the engine gives an answer or a clear error (a ``LockError``), never
another exception and never a hang: a try returns at once, a bounded wait returns on time
with a bounded number of Redis commands, and a lock it reports acquired is really its own
and releases cleanly. Timestamps the test can judge on its own are honoured (ahead of the
server clock: held) or taken over (past, or not a timestamp and without a TTL).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_singleton_lock import LockBackendError, LockError, RedisLock
from celery_singleton_lock.engine.keyspace import companion_key
from celery_singleton_lock.testing import RedisServer

MODES = [pytest.param(True, id="scripting"), pytest.param(False, id="plain")]
FUZZ = settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
#: A bounded wait of this long returns within it plus this slack. The slack is there for a
#: busy machine (200 examples, any one of which may be descheduled); it stays below the
#: client's 5 s socket timeout, so a call that hangs on a read is still caught.
WAIT = 0.25
SLACK = 4.0
#: Redis commands a wait may cost per second (fallback poll 0.1 s: about 100/s measured,
#: in-script commands included; a busy poll makes thousands), plus a fixed allowance.
MAX_COMMANDS_PER_SECOND = 200
MAX_COMMANDS_FIXED = 15


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    """A redis-server of this module's own: commands are counted on it."""
    with RedisServer() as started:
        yield started


@dataclass(frozen=True)
class Planted:
    """What to put at the lock key (or, with ``companion``, at its waiters' queue)."""

    kind: str  # string | list | set | zset | hash | stream
    payload: bytes = b"x"
    ttl_ms: int | None = None
    companion: bool = False

    def plant(self, client: redis.Redis, name: str) -> None:
        key = companion_key(name, "queue") if self.companion else name
        if self.kind == "string":
            client.set(key, self.payload)
        elif self.kind == "list":
            client.rpush(key, self.payload)
        elif self.kind == "set":
            client.sadd(key, self.payload)
        elif self.kind == "zset":
            client.zadd(key, {self.payload: 1})
        elif self.kind == "hash":
            client.hset(key, "f", self.payload)
        else:
            client.xadd(key, {"f": self.payload})
        if self.ttl_ms is not None:
            client.pexpire(key, self.ttl_ms)


def _number(value: int) -> bytes:
    return str(value).encode()


numbers = st.one_of(
    st.integers(min_value=-(10**20), max_value=10**20),
    st.integers(min_value=0, max_value=2**53 + 10),
    st.sampled_from([0, 1, 2**53 - 1, 2**53, 10**16, 10**17, -1]),
)
ours = st.builds(
    lambda expiry, flag, token, fence, info: b":".join([expiry, flag, token, fence, info]),
    numbers.map(_number) | st.binary(max_size=6),
    st.sampled_from([b"0", b"1", b"2", b"", b"x"]),
    st.binary(max_size=8),
    numbers.map(_number) | st.binary(max_size=6),
    st.binary(max_size=12),
)
payloads = st.one_of(
    st.binary(max_size=64),
    numbers.map(_number),
    st.floats(allow_nan=True, allow_infinity=True).map(lambda x: repr(x).encode()),
    ours,
)
planted = st.one_of(
    st.builds(Planted, st.just("string"), payloads, st.none() | st.integers(1, 5000)),
    st.builds(
        Planted,
        st.sampled_from(["list", "set", "zset", "hash", "stream"]),
        st.binary(min_size=1, max_size=8),
        st.none() | st.integers(1, 5000),
        st.booleans(),
    ),
    st.builds(Planted, st.just("string"), payloads, st.none(), st.just(True)),
)


def _commands(client: redis.Redis) -> int:
    return int(client.info("stats")["total_commands_processed"])


@pytest.mark.parametrize("scripting", MODES)
def test_any_planted_value_gives_an_answer_or_a_clear_error(
    server: RedisServer, scripting: bool
) -> None:
    """Whatever is planted: try, bounded wait, locked/holder/owned and release either answer
    or raise a LockError; a try returns at once; a bounded wait returns on time with a
    bounded number of commands; an acquired lock is ours and releases cleanly."""
    client = redis.Redis(port=server.port, socket_timeout=5)
    outcomes: dict[str, int] = {}

    @FUZZ
    @given(thing=planted)
    def check(thing: Planted) -> None:
        name = f"fuzz:{uuid.uuid4().hex[:10]}"
        thing.plant(client, name)
        lock = RedisLock(client, name, timeout=5, scripting=scripting, fallback_poll=0.1)
        outcome = "error"
        try:
            started = time.monotonic()
            acquired = lock.acquire(blocking=False)
            assert time.monotonic() - started < SLACK
            if not acquired:
                before = _commands(client)
                started = time.monotonic()
                acquired = lock.acquire(timeout=WAIT)
                waited = time.monotonic() - started
                assert waited < WAIT + SLACK
                budget = MAX_COMMANDS_PER_SECOND * max(waited, WAIT) + MAX_COMMANDS_FIXED
                assert _commands(client) - before <= budget
            outcome = "acquired" if acquired else "held"
            if acquired:
                assert lock.owned()
                assert lock.fencing_token is not None
                lock.release()
                assert not lock.owned()
        except LockError:
            pass  # a clear error: the bytes at the key are not a lock this engine can use
        for probe in (lock.locked, lock.holder, lock.owned):
            with contextlib.suppress(LockError):  # an answer, or a clear error
                probe()
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        client.delete(name, companion_key(name, "queue"))

    try:
        check()
    finally:
        client.close()
    # The fuzz reached every kind of answer.
    assert set(outcomes) == {"acquired", "held", "error"}, outcomes


@pytest.mark.parametrize("scripting", MODES)
def test_classic_timestamps_are_honoured_or_taken_over(
    server: RedisServer, scripting: bool
) -> None:
    """A plain Unix timestamp (seconds or milliseconds, as classic SETNX lockers write)
    ahead of the server clock is held and one in the past is taken over; a negative one
    and a number too big to be a timestamp, without a TTL, are outside the grammar: the
    acquire raises and leaves them as they are."""
    client = redis.Redis(port=server.port, socket_timeout=5)

    @FUZZ
    @given(
        offset=st.integers(min_value=-(10**6), max_value=10**6).filter(lambda x: abs(x) > 2),
        unit=st.sampled_from(["s", "ms"]),
        odd=st.sampled_from([None, "negative", "huge"]),
    )
    def check(offset: int, unit: str, odd: str | None) -> None:
        name = f"fuzz:{uuid.uuid4().hex[:10]}"
        seconds, micros = (int(part) for part in client.time())
        now_s = seconds + micros / 1e6
        if odd == "negative":
            value, held = f"-{abs(offset)}", False
        elif odd == "huge":
            value, held = "9" * 17, False  # beyond the grammar's 16 digits: foreign, no TTL
        else:
            moment = now_s + offset
            value = str(int(moment if unit == "s" else moment * 1000))
            held = offset > 0
        client.set(name, value)
        lock = RedisLock(client, name, timeout=5, scripting=scripting, fallback_poll=0.1)
        if odd is not None:  # outside the grammar, no TTL: never overwritten silently
            with pytest.raises(LockBackendError, match="never overwritten silently"):
                lock.acquire(blocking=False)
            assert client.get(name) == value.encode()
            client.delete(name)
            return
        assert lock.acquire(blocking=False) is (not held), value
        if held:
            assert lock.locked()
            assert client.get(name) == value.encode()  # never deleted blind
        else:
            lock.release()
        client.delete(name)

    try:
        check()
    finally:
        client.close()
