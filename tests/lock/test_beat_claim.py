"""The beat group's scripts against a real redis-server (``engine.beat``): a slot is taken
only by the lease's holder with the lease's fencing token, only once, and never before a
slot the entry already took; a slot given back can be taken again; heartbeats that ran out
are dropped."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis
from redis.cluster import key_slot

from celery_singleton_lock import RedisLock
from celery_singleton_lock.engine import beat as engine


def leader_key(key: str) -> str:
    return f"{key}:beat:{{g}}"


def take(
    client: redis.Redis, lock: RedisLock, keys: engine.BeatKeys, slot: int, **given: Any
) -> engine.Claim:
    """``lock``'s holder (or ``token``/``fence`` given) claims ``slot`` of an entry."""
    return engine.claim(
        client,
        keys,
        token=str(given.get("token", lock.token)),
        fence=int(given.get("fence", lock.fencing_token or 0)),
        entry=str(given.get("entry", "job")),
        slot_ms=slot,
        send=bool(given.get("send", True)),
        keep_ms=60_000,
    )


def test_keys_share_one_hash_slot(key: str) -> None:
    """The lease, the slot records and the heartbeats hash to one Cluster slot."""
    keys = engine.BeatKeys(leader_key(key))
    assert key_slot(keys.leader.encode()) == key_slot(keys.slots.encode())
    assert key_slot(keys.leader.encode()) == key_slot(keys.replicas.encode())


def test_only_the_lease_holder_with_its_fencing_token_takes_a_slot(
    client: redis.Redis, key: str
) -> None:
    """A wrong fencing token, a wrong owner token, or no lease at all: nothing taken."""
    keys = engine.BeatKeys(leader_key(key))
    lock = RedisLock(client, keys.leader, timeout=30)
    assert lock.acquire(blocking=False)
    fence = lock.fencing_token or 0
    assert not take(client, lock, keys, 1000, fence=fence - 1).leads
    assert not take(client, lock, keys, 1000, fence=fence + 1).leads
    assert not take(client, lock, keys, 1000, token="someone-else").leads
    with pytest.raises(ValueError, match="owner and fencing token"):
        take(client, lock, keys, 1000, token="", fence=0)
    assert client.hget(keys.slots, "job") is None
    claim = take(client, lock, keys, 1000)
    assert claim.taken
    assert claim.leads
    lock.release()
    assert not take(client, lock, keys, 2000, fence=fence).leads  # the lease is gone


def test_a_slot_is_taken_once_and_never_before_the_last(client: redis.Redis, key: str) -> None:
    """The same slot again, or an earlier one: refused with the entry's record."""
    keys = engine.BeatKeys(leader_key(key))
    lock = RedisLock(client, keys.leader, timeout=30)
    assert lock.acquire(blocking=False)
    assert take(client, lock, keys, 5000).taken
    again = take(client, lock, keys, 5000)
    assert not again.taken
    assert again.leads
    assert again.record is not None
    assert again.record.slot == 5000
    assert again.record.state == engine.CLAIMED
    assert not take(client, lock, keys, 4000).taken
    assert take(client, lock, keys, 6000, send=False).taken  # skipped by the catch-up rule
    record = engine.parse_records(client.hgetall(keys.slots))["job"]
    assert (record.slot, record.state, record.before) == (6000, engine.SKIPPED, 5000)
    lock.release()


def test_settle_sent_and_given_back(client: redis.Redis, key: str) -> None:
    """Sent: the record says so. Given back: the slot may be taken again (not an earlier
    one), and the record keeps the slot before it."""
    keys = engine.BeatKeys(leader_key(key))
    lock = RedisLock(client, keys.leader, timeout=30)
    assert lock.acquire(blocking=False)
    fence = lock.fencing_token or 0
    assert take(client, lock, keys, 1000).taken
    assert engine.settle(client, keys, entry="job", slot_ms=1000, fence=fence, sent=True)
    assert not engine.settle(client, keys, entry="job", slot_ms=1000, fence=fence, sent=True)
    assert take(client, lock, keys, 2000).taken
    assert not engine.settle(client, keys, entry="job", slot_ms=2000, fence=fence + 1, sent=False)
    assert engine.settle(client, keys, entry="job", slot_ms=2000, fence=fence, sent=False)
    record = engine.parse_records(client.hgetall(keys.slots))["job"]
    assert (record.state, record.last_taken) == (engine.GIVEN_BACK, 1000)
    assert not take(client, lock, keys, 1500).taken
    assert take(client, lock, keys, 2000).taken
    lock.release()


def test_a_deposed_leader_and_its_successor_race_one_slot_once(
    client: redis.Redis, key: str
) -> None:
    """The old leader's lease runs out and a new one takes it (a higher fencing token);
    both try every slot at once: each slot is taken exactly once, always by the new one."""
    keys = engine.BeatKeys(leader_key(key))
    old = RedisLock(client, keys.leader, timeout=0.2)
    assert old.acquire(blocking=False)
    old_token, old_fence = old.token or "", old.fencing_token or 0
    new = RedisLock(client, keys.leader, timeout=60)
    assert new.acquire(blocking=True, timeout=30)  # returns once the old lease has ended
    new_token, new_fence = new.token or "", new.fencing_token or 0
    assert new_fence > old_fence
    results: dict[str, list[engine.Claim]] = {"old": [], "new": []}
    start = threading.Barrier(2)

    def race(name: str, token: str, fence: int) -> None:
        conn = redis.Redis(connection_pool=client.connection_pool)
        start.wait(timeout=30)
        for slot in range(1, 201):
            results[name].append(engine.claim(
                conn, keys, token=token, fence=fence, entry="race", slot_ms=slot * 1000,
                send=True, keep_ms=60_000,
            ))  # fmt: skip

    threads = [
        threading.Thread(target=race, args=("old", old_token, old_fence)),
        threading.Thread(target=race, args=("new", new_token, new_fence)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(claim.taken for claim in results["old"])
    assert not any(claim.leads for claim in results["old"])
    assert [claim.taken for claim in results["new"]] == [True] * 200
    new.release()


def test_presence_keeps_live_heartbeats_and_returns_the_records(
    client: redis.Redis, key: str
) -> None:
    """A heartbeat is listed until it runs out (then the next heartbeat drops it); leaving
    removes it at once; every call returns the server time and the slot records."""
    keys = engine.BeatKeys(leader_key(key))
    lock = RedisLock(client, keys.leader, timeout=30)
    assert lock.acquire(blocking=False)
    assert take(client, lock, keys, 7000).taken
    now, records = engine.presence(
        client, keys, replica="a", info="{}", ttl_ms=60_000, keep_ms=60_000
    )
    assert abs(now - time.time() * 1000) < 60_000
    assert records["job"].slot == 7000
    engine.presence(client, keys, replica="short", info="{}", ttl_ms=1, keep_ms=60_000)
    deadline = time.monotonic() + 30
    while client.hexists(keys.replicas, "short") and time.monotonic() < deadline:
        engine.presence(client, keys, replica="a", info="{}", ttl_ms=60_000, keep_ms=60_000)
    assert not client.hexists(keys.replicas, "short")
    engine.leave(client, keys, replica="a", keep_ms=60_000)
    assert not client.hexists(keys.replicas, "a")
    assert client.pttl(keys.slots) > 0
    lock.release()
