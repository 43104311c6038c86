"""Pure pieces of the engine: value parsing, hash slots, exceptions."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot

from celery_singleton_lock import (
    LockBackendError,
    LockConnectionError,
    LockError,
    LockLost,
    LockNotOwned,
    TaskLocked,
    WeightAboveLimit,
)
from celery_singleton_lock.engine.keyspace import companion_key
from celery_singleton_lock.engine.value import MAX_EXACT, format_value, parse_value
from celery_singleton_lock.exceptions import SingletonLockError


@given(st.binary(max_size=200))
def test_parse_value_never_raises(raw: bytes) -> None:
    """Any bytes at all parse to some LockValue."""
    parse_value(raw)


@given(
    st.integers(0, MAX_EXACT),
    st.booleans(),
    st.text(st.characters(blacklist_characters=":", blacklist_categories=["Cs"]), min_size=1),
    st.integers(0, MAX_EXACT),
    st.text(st.characters(blacklist_categories=["Cs"]), max_size=80),
)
def test_format_and_parse_round_trip(
    expiry: int, waiters: bool, token: str, fence: int, info: str
) -> None:
    """Our own values read back exactly, whatever the holder info contains (numbers up to
    the grammar's limit, 2^53 - 1; beyond it a value is foreign)."""
    value = parse_value(format_value(expiry, waiters, token, fence, info).encode())
    assert (value.expiry_ms, value.waiters, value.token, value.fence, value.info) == (
        expiry, waiters, token, fence, info,
    )  # fmt: skip


def test_classic_values_are_read_as_expiry_timestamps() -> None:
    """Plain integers are seconds below 10**11 and milliseconds above; decimals are seconds."""
    assert parse_value(b"1700000000").expiry_ms == 1_700_000_000_000
    assert parse_value(b"1700000000123").expiry_ms == 1_700_000_000_123
    assert parse_value(b"1700000000.5").expiry_ms == 1_700_000_000_500
    assert parse_value(b"1700000000").classic
    assert parse_value(b"-5").expiry_ms is None


@pytest.mark.parametrize("name", ["orders:sku-42", "{lock_goods}:300", "a{b", "x"])
def test_companion_keys_share_the_lock_hash_slot(name: str) -> None:
    """Signal keys hash to the lock's Redis Cluster slot, with or without a hash tag."""
    assert key_slot(companion_key(name, "signal").encode()) == key_slot(name.encode())


@pytest.mark.parametrize("name", ["a}b", "a{}b", "{}x{y}"])
def test_name_with_unmatched_closing_brace_is_refused(name: str) -> None:
    """A name whose slot cannot be shared is rejected with advice, not silently split."""
    with pytest.raises(ValueError, match="hash tag"):
        companion_key(name, "signal")


@pytest.mark.parametrize(
    "exc",
    [
        LockError("boom", "k"),
        LockNotOwned("gone", "k"),
        LockBackendError("down", "k"),
        LockConnectionError("down", "k"),
        LockLost("lost", "k"),
        WeightAboveLimit("csl:t:{x}", "tenant:7", 2, 3),
        TaskLocked("csl:t:{x}", "task-1"),
        TaskLocked("csl:t:{x}"),
    ],
)
def test_exceptions_pickle_and_share_one_root(exc: Exception) -> None:
    """Every exception survives pickling with its fields and derives from SingletonLockError."""
    copy = pickle.loads(pickle.dumps(exc))
    assert type(copy) is type(exc)
    assert str(copy) == str(exc)
    assert copy.__dict__ == exc.__dict__
    assert isinstance(copy, SingletonLockError)


def test_numbers_beyond_the_grammar_make_a_foreign_value() -> None:
    """Past 2^53 - 1 (not exact as a double, which the scripts compute with) a value is
    foreign, in the expiry and in the fencing token alike."""
    assert parse_value(format_value(MAX_EXACT + 1, False, "t", 1, "").encode()).expiry_ms is None
    assert parse_value(format_value(1, False, "t", MAX_EXACT + 1, "").encode()).expiry_ms is None
