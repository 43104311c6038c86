"""Owner-only release and extend, leases, fencing tokens, re-entry with one token."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from celery_singleton_lock import LockNotOwned, RedisLock
from celery_singleton_lock.engine.value import parse_value


def test_release_after_lease_expiry_raises_and_spares_the_new_holder(make_lock: Any) -> None:
    """A holder that outlived its lease gets LockNotOwned and the next holder keeps the lock."""
    late, successor = make_lock(timeout=0.3), make_lock(timeout=10)
    assert late.acquire()
    time.sleep(0.35)
    assert successor.acquire(blocking=False)
    with pytest.raises(LockNotOwned):
        late.release()
    assert successor.owned()
    assert successor.locked()
    successor.release()
    assert not successor.locked()


def test_release_of_a_never_acquired_lock_raises(make_lock: Any) -> None:
    """release() by an instance that never held the lock raises and deletes nothing."""
    holder, stranger = make_lock(), make_lock()
    assert holder.acquire()
    with pytest.raises(LockNotOwned):
        stranger.release()
    assert holder.owned()
    holder.release()


def test_extend_pushes_the_lease_end(make_lock: Any, client: redis.Redis, key: str) -> None:
    """extend() moves the lease end to server now + lease, so the lock outlives its first lease."""
    holder, rival = make_lock(timeout=0.4), make_lock()
    assert holder.acquire()
    time.sleep(0.25)
    holder.extend(5.0)  # 5 s: the next 0.3 s sleep may overrun on a busy machine
    assert client.pttl(key) > 5000
    time.sleep(0.3)
    assert not rival.acquire(blocking=False)
    assert holder.owned()
    holder.release()


def test_extend_by_non_owner_raises(make_lock: Any) -> None:
    """extend() by an instance whose lease was taken over raises LockNotOwned."""
    late, successor = make_lock(timeout=0.2), make_lock()
    assert late.acquire()
    time.sleep(0.25)
    assert successor.acquire(blocking=False)
    with pytest.raises(LockNotOwned):
        late.extend()
    assert successor.owned()


def test_key_has_a_ttl_slightly_past_the_lease(
    make_lock: Any, client: redis.Redis, key: str
) -> None:
    """The key carries a Redis TTL a little beyond the lease, so abandoned keys vanish:
    compared on the server's clock (lease end in the value, TTL end from one read of TIME
    and PTTL), whenever this reads them."""
    lock = make_lock(timeout=2)
    assert lock.acquire()
    pipe = client.pipeline(transaction=True)
    pipe.get(key).time().pttl(key)
    raw, (seconds, micros), ttl = pipe.execute()
    lease_ends = parse_value(raw).expiry_ms
    assert lease_ends is not None
    key_ends = int(seconds) * 1000 + int(micros) // 1000 + ttl
    assert 1000 - 2 <= key_ends - lease_ends <= 1300, (key_ends, lease_ends)


def test_fencing_tokens_increase_across_releases_and_steals(make_lock: Any) -> None:
    """Every acquisition, plain or by taking over an expired lease, gets a larger token."""
    tokens = []
    for _ in range(5):
        lock = make_lock(timeout=5)
        assert lock.acquire()
        tokens.append(lock.fencing_token)
        lock.release()
    for _ in range(3):
        lock = make_lock(timeout=0.1)
        assert lock.acquire()
        tokens.append(lock.fencing_token)
        time.sleep(0.15)  # abandoned: the next one steals it
    assert all(isinstance(token, int) for token in tokens)
    assert tokens == sorted(tokens)
    assert len(set(tokens)) == len(tokens)


def test_fencing_tokens_increase_across_protocol_modes(client: redis.Redis, key: str) -> None:
    """Scripted and plain-command instances on one key issue one increasing sequence."""
    tokens = []
    for scripting in (True, False, True, False):
        lock = RedisLock(client, key, timeout=0.1, scripting=scripting)
        assert lock.acquire()
        tokens.append(lock.fencing_token)
        time.sleep(0.12)
    assert tokens == sorted(tokens)
    assert len(set(tokens)) == len(tokens)


def test_fence_exceeds_a_stale_holders_even_when_the_clock_lags(
    make_lock: Any, client: redis.Redis, key: str
) -> None:
    """Taking over a lease whose stored token is ahead of the server clock still goes up."""
    ahead = 4 * 10**15  # ahead of the µs clock, inside the 2**53 a Lua number holds exactly
    expiry_ms = int(client.time()[0]) * 1000 - 1000
    client.set(key, f"{expiry_ms}:0:someone:{ahead}:{{}}", px=5000)
    lock = make_lock()
    assert lock.acquire(blocking=False)
    assert lock.fencing_token == ahead + 1


def test_same_token_reacquires_its_own_hold(make_lock: Any) -> None:
    """Two instances sharing an owner token are one owner: the second acquire succeeds and
    keeps the fencing token (how a queued task's run takes over the enqueuer's lock)."""
    first = make_lock(token="task-1234")
    second = make_lock(token="task-1234")
    other = make_lock()
    assert first.acquire(blocking=False)
    assert not other.acquire(blocking=False)
    assert second.acquire(blocking=False)
    assert second.fencing_token == first.fencing_token
    second.release()
    assert other.acquire(blocking=False)


def test_context_manager_releases_on_exit_and_on_error(make_lock: Any) -> None:
    """``with`` acquires, and releases both after the block and when the block raises."""
    with make_lock() as held:
        assert held.owned()
    assert not held.locked()
    with pytest.raises(ZeroDivisionError), make_lock() as held:
        _ = 1 / 0
    assert not held.locked()


def test_client_clock_an_hour_off_cannot_break_exclusion(
    make_lock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the client's wall clock an hour ahead or behind, a held lock stays held and an
    expiry is judged by the server: the engine never reads the client's clock."""
    holder = make_lock(timeout=1)
    assert holder.acquire()
    real = time.time
    for offset in (3600.0, -3600.0):
        monkeypatch.setattr(time, "time", lambda offset=offset: real() + offset)
        assert not make_lock().acquire(blocking=False)
    monkeypatch.setattr(time, "time", lambda: real() - 3600.0)
    skewed = make_lock(timeout=5)
    assert skewed.acquire(timeout=3)  # only after the server says the lease ended
    assert skewed.owned()
    with pytest.raises(LockNotOwned):
        holder.release()


def test_scripts_reload_after_script_flush(make_lock: Any, client: redis.Redis) -> None:
    """A server that forgot our scripts (restart, failover, SCRIPT FLUSH) gets them again."""
    lock = make_lock()
    assert lock.acquire()
    client.script_flush()
    lock.extend()
    lock.release()
    client.script_flush()
    assert lock.acquire(blocking=False)
    lock.release()


def test_claim_takes_over_a_hold_atomically_keeping_its_fencing_token(make_lock: Any) -> None:
    """A lock built with ``claim=T`` takes over the hold of owner token T (a queued task's
    lock, claimed by the delivery that runs it); a second claimant of T then contends like
    anyone else, and T itself no longer owns anything."""
    queued = make_lock(token="q-1", timeout=30)
    assert queued.acquire(blocking=False)
    fence = queued.fencing_token
    first = make_lock(token="r-1", claim="q-1", timeout=30)
    assert first.acquire(blocking=False)
    assert first.fencing_token == fence
    assert first.owned()
    assert not queued.owned()
    second = make_lock(token="r-2", claim="q-1", timeout=30)
    assert not second.acquire(blocking=False)
    with pytest.raises(LockNotOwned):
        queued.release()
    assert first.owned()
    first.release()
    assert second.acquire(blocking=False)  # a free lock: a fresh hold with a new token
    assert second.fencing_token is not None
    assert fence is not None
    assert second.fencing_token > fence
    second.release()


def test_claim_is_validated(make_lock: Any) -> None:
    with pytest.raises(ValueError, match="claim"):
        make_lock(claim="a:b")
