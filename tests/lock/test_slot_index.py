"""The slot index of a lock with many slots (``limit=N``): an acquire's cost does not grow
with N, the index is only a cache (a lost or wrong one never gives a slot two holders nor
lets more than N in, and is rebuilt by the acquires), and the group, claim, hand-off and
expiry rules hold at an N far beyond what reading every slot allowed (the old script read
all N with one MGET and failed from about 8,000 slots on)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from celery_singleton_lock import LockNotOwned, RedisLock
from celery_singleton_lock.engine import atomic, constants
from celery_singleton_lock.engine.keyspace import OWNERS, SLOTS, companion_key
from celery_singleton_lock.engine.scripted import extend_all
from celery_singleton_lock.engine.scripts import SCRIPTS
from celery_singleton_lock.engine.value import parse_value
from celery_singleton_lock.testing import RedisServer

#: Beyond the old script's reach (Lua's unpack limit, about 8,000 slots), yet quick to fill.
LARGE = 20_000


def slots(client: redis.Redis, key: str, limit: int, **kwargs: Any) -> RedisLock:
    kwargs.setdefault("timeout", 60)
    return RedisLock(client, key, limit=limit, **kwargs)


def fill(
    client: redis.Redis, key: str, limit: int, count: int, lease_ms: int = 60_000
) -> list[str]:
    """``count`` holds of ``key`` taken by ACQUIRE_SLOTS itself, pipelined (a slot each, as
    ``count`` separate ``acquire(blocking=False)`` calls would take them): their tokens."""
    script = SCRIPTS["acquire_slots"]
    client.script_load(script.source)
    queue = companion_key(key, "queue")
    tokens = [uuid.uuid4().hex for _ in range(count)]
    pipe: Any = client.pipeline(transaction=False)
    for token in tokens:
        pipe.execute_command(
            "EVALSHA", script.sha, 2, key, queue, token, lease_ms, "{}", "x", 1000, limit, ""
        )
    replies = pipe.execute()
    assert all(int(reply[0]) == 1 for reply in replies)
    return tokens


def slot_values(client: redis.Redis, lock: RedisLock, upto: int) -> dict[str, str]:
    """The owner token in each of slots 1 .. upto that holds a live value (read directly,
    not through the index)."""
    keys = [lock.slot_key(i) for i in range(1, upto + 1)]
    now_ms = int(client.time()[0]) * 1000
    found = {}
    for key, raw in zip(keys, client.mget(keys), strict=True):
        if raw is not None:
            value = parse_value(raw)
            if value.token is not None and value.held_at(now_ms):
                found[key] = value.token
    return found


@pytest.fixture
def counted(fresh_server: RedisServer) -> Iterator[redis.Redis]:
    """A client of a server of this test's own, whose command statistics it reads."""
    client = redis.Redis.from_url(fresh_server.url)
    yield client
    client.close()


def _one_acquire(client: redis.Redis, lock: RedisLock) -> tuple[int, int, int]:
    """(EVALSHA calls, commands run inside them, keys looked up) of one non-blocking
    acquire, by the server's own counters (INFO commandstats and keyspace hits / misses)."""
    client.config_resetstat()
    assert lock.acquire(blocking=False)
    stats = client.info("commandstats")
    keyspace = client.info("stats")
    calls = {name: int(entry["calls"]) for name, entry in stats.items()}
    evalsha = calls.pop("cmdstat_evalsha", 0)
    inside = sum(calls.values()) - calls.get("cmdstat_config", 0) - calls.get("cmdstat_info", 0)
    return evalsha, inside, int(keyspace["keyspace_hits"]) + int(keyspace["keyspace_misses"])


def test_an_acquire_at_a_hundred_thousand_slots_succeeds(client: redis.Redis, key: str) -> None:
    """limit=100,000 (MAX_LIMIT): an acquire takes a slot, a second another one, and both
    release; the old script failed here (Lua's unpack limit) on every try."""
    assert constants.MAX_LIMIT == 100_000
    first = slots(client, key, constants.MAX_LIMIT)
    second = slots(client, key, constants.MAX_LIMIT)
    assert first.acquire(blocking=False)
    assert second.acquire(blocking=False)
    assert first.held_key != second.held_key
    assert {holder.token for holder in first.holders()} == {first.token, second.token}
    first.release()
    second.release()
    assert not first.locked()


def test_one_acquire_costs_the_same_at_three_and_a_hundred_thousand_slots(
    counted: redis.Redis,
) -> None:
    """With two slots held, one more acquire costs one round trip and the same commands and
    key lookups at N = 3, 1,000 and 100,000 (the old script read all N slots: N lookups)."""
    costs = {}
    for limit in (3, 1000, constants.MAX_LIMIT):
        key = f"cost:{{{limit}}}"
        held = [slots(counted, key, limit) for _ in range(2)]
        assert all(lock.acquire(blocking=False) for lock in held)
        lock = slots(counted, key, limit)
        costs[limit] = _one_acquire(counted, lock)
        for each in (*held, lock):
            each.release()
    assert costs[3][0] == 1
    assert costs[3] == costs[1000] == costs[constants.MAX_LIMIT], costs
    assert costs[3][2] <= 12, costs  # a handful of keys, not N


def test_an_acquire_of_a_full_lock_costs_the_same_whatever_n(counted: redis.Redis) -> None:
    """Every slot held: a refused non-blocking try costs the same at N = 3 and N = LARGE."""
    costs = {}
    for limit in (3, LARGE):
        key = f"full:{{{limit}}}"
        fill(counted, key, limit, limit)
        lock = slots(counted, key, limit)
        counted.config_resetstat()
        assert not lock.acquire(blocking=False)
        stats = counted.info("commandstats")
        keyspace = counted.info("stats")
        costs[limit] = (
            sum(int(entry["calls"]) for name, entry in stats.items() if "config" not in name),
            int(keyspace["keyspace_hits"]) + int(keyspace["keyspace_misses"]),
        )
    assert costs[3] == costs[LARGE], costs


def test_the_limit_has_an_upper_bound(client: redis.Redis, key: str) -> None:
    """limit above MAX_LIMIT is refused at construction; MAX_LIMIT itself is accepted."""
    RedisLock(client, key, limit=constants.MAX_LIMIT)
    with pytest.raises(ValueError, match="limit"):
        RedisLock(client, key, limit=constants.MAX_LIMIT + 1)


def test_the_index_is_rebuilt_after_being_deleted_while_slots_are_held(
    client: redis.Redis, key: str
) -> None:
    """Five slots, three held; the index and its owners' hash are deleted. The next acquires
    find the held slots (never taking one), take the two free ones, and refuse a sixth;
    the old holders still release and extend their own slots, and holders() lists all."""
    held = [slots(client, key, 5) for _ in range(3)]
    assert all(lock.acquire(blocking=False) for lock in held)
    client.delete(companion_key(key, SLOTS), companion_key(key, OWNERS))
    newcomers = [slots(client, key, 5) for _ in range(2)]
    assert all(lock.acquire(blocking=False) for lock in newcomers)
    everyone = held + newcomers
    assert len({lock.held_key for lock in everyone}) == 5
    sixth = slots(client, key, 5)
    assert not sixth.acquire(blocking=False)
    assert slot_values(client, sixth, 5) == {lock.held_key: lock.token for lock in everyone}
    assert {holder.token for holder in sixth.holders()} == {lock.token for lock in everyone}
    assert client.pttl(companion_key(key, SLOTS)) > 0  # the rebuilt index still expires
    held[0].extend()
    held[0].release()
    assert sixth.acquire(blocking=False)
    assert sixth.held_key not in {lock.held_key for lock in everyone[1:]}
    for lock in (*everyone[1:], sixth):
        lock.release()
    assert not sixth.locked()


def test_a_lost_index_with_many_slots_held_is_rebuilt_by_successive_tries(
    client: redis.Redis, key: str
) -> None:
    """Sixty slots, forty held, the index deleted: one try checks a bounded number of
    candidates, so the first tries may report the lock held, but within a few tries every
    free slot is taken, no held slot twice, and never more than sixty holders."""
    limit = 60
    owners = fill(client, key, limit, 40)
    client.delete(companion_key(key, SLOTS), companion_key(key, OWNERS))
    taken: list[RedisLock] = []
    tries = 0
    while len(taken) < limit - 40 and tries < 200:
        tries += 1
        lock = slots(client, key, limit)
        if lock.acquire(blocking=False):
            taken.append(lock)
        live = slot_values(client, lock, limit)
        assert len(live) <= limit
        assert set(owners) <= set(live.values())  # no held slot was taken over
    assert len(taken) == limit - 40
    assert tries <= limit - 40 + 40 // constants.SLOT_PROBES + 2
    assert not slots(client, key, limit).acquire(blocking=False)
    assert len(slot_values(client, taken[0], limit + 5)) == limit


def test_an_index_that_says_held_slots_are_free_never_double_grants(
    client: redis.Redis, key: str
) -> None:
    """Every score in the index rewritten to 'free': the acquires check each candidate's
    value, take only the slots really free, and correct the others."""
    limit = 8
    owners = fill(client, key, limit, 6)
    index = companion_key(key, SLOTS)
    client.zadd(index, {str(i): i for i in range(1, limit + 1)})
    client.zadd(index, {"garbage": 1, "0": 2})  # not slot numbers: dropped on the way
    first, second, third = (slots(client, key, limit) for _ in range(3))
    assert first.acquire(blocking=False)
    assert second.acquire(blocking=False)
    assert not third.acquire(blocking=False)
    live = slot_values(client, third, limit)
    assert len(live) == limit
    assert set(live.values()) == set(owners) | {first.token, second.token}
    assert client.zscore(index, "garbage") is None
    assert client.zscore(index, "0") is None


def test_a_group_never_holds_two_slots_at_large_n(client: redis.Redis, key: str) -> None:
    """At N = LARGE with thousands of slots held, a second hold of one group is refused
    (and not queued) while slots are free for everyone else; it gets one once the first
    is released."""
    fill(client, key, LARGE, 5000)
    first = slots(client, key, LARGE, group="task-7-")
    second = slots(client, key, LARGE, group="task-7-")
    other = slots(client, key, LARGE, group="task-8-")
    assert first.acquire(blocking=False)
    assert not second.acquire(blocking=False)
    assert not second.acquire(timeout=0.3)
    assert client.zscore(companion_key(key, "queue"), second.group) is None
    assert other.acquire(blocking=False)
    first.release()
    assert second.acquire(blocking=False)
    second.release()
    other.release()


def test_a_claim_takes_over_the_queued_hold_at_large_n(client: redis.Redis, key: str) -> None:
    """A hold taken under a queue token (a published message) is claimed by its run at
    N = LARGE: the same slot, the same fencing token, and the queue token no longer owns
    it; a second delivery of that task (same group) is refused a slot."""
    fill(client, key, LARGE, 3000)
    queued = slots(client, key, LARGE, token="t1234-q", group="t1234-", timeout=3600)
    assert queued.acquire(blocking=False)
    slot, fence = queued.held_key, queued.fencing_token
    queued.detach()
    run = slots(client, key, LARGE, claim="t1234-q", group="t1234-")
    assert run.acquire(blocking=False)
    assert run.held_key == slot
    assert run.fencing_token == fence
    again = slots(client, key, LARGE, group="t1234-")
    assert not again.acquire(blocking=False)
    with pytest.raises(LockNotOwned):
        slots(client, key, LARGE, token="t1234-q").release()
    run.release()


def test_a_released_slot_is_handed_to_the_first_waiter_at_large_n(
    client: redis.Redis, key: str
) -> None:
    """All LARGE slots held: a blocked waiter is handed the slot a holder releases (the
    release's own step, no new try), with a larger fencing token; the slot then counts as
    its group's, so a second hold of that group is refused."""
    tokens = fill(client, key, LARGE, LARGE)
    last = int(client.get(companion_key(key, "fence")) or 0)
    waiter = slots(client, key, LARGE, group="task-9-", fallback_poll=60.0)
    got: dict[str, float] = {}

    def wait() -> None:
        if waiter.acquire(timeout=90):
            got["at"] = time.perf_counter()

    thread = threading.Thread(target=wait)
    thread.start()
    deadline = time.monotonic() + 30
    while client.zcard(companion_key(key, "queue")) < 1:  # the waiter is queued and blocked
        assert time.monotonic() < deadline, "the waiter never queued"
        time.sleep(0.01)
    victim = RedisLock(client, key, limit=LARGE, token=tokens[1234])
    released = time.perf_counter()
    victim.release()
    thread.join(90)
    assert "at" in got
    assert got["at"] - released < 30  # handed over, not found at the next poll (60 s on)
    assert waiter.held_key == RedisLock(client, key, limit=LARGE).slot_key(1235)
    assert (waiter.fencing_token or 0) > last
    twin = slots(client, key, LARGE, group="task-9-")
    assert not twin.acquire(blocking=False)
    waiter.release()


def test_an_expired_slot_comes_back_at_large_n(client: redis.Redis, key: str) -> None:
    """All LARGE slots held, one on a short lease: once that lease ends (its holder
    crashed), an acquire takes that very slot, with a larger fencing token."""
    fill(client, key, LARGE, LARGE - 1)
    short = slots(client, key, LARGE, timeout=0.3)
    assert short.acquire(blocking=False)
    assert not slots(client, key, LARGE).acquire(blocking=False)
    time.sleep(0.4)
    thief = slots(client, key, LARGE)
    assert thief.acquire(blocking=False)
    assert thief.held_key == short.held_key
    assert (thief.fencing_token or 0) > (short.fencing_token or 0)
    with pytest.raises(LockNotOwned):
        short.release()
    thief.release()


def test_extend_renewal_and_hold_keep_the_index_right(client: redis.Redis, key: str) -> None:
    """A slot's score in the index follows its lease: acquire, extend, the pipelined
    extend_all of the renewal lanes, the success hold, and a release (free again)."""
    index = companion_key(key, SLOTS)
    first, second = slots(client, key, 4, timeout=5), slots(client, key, 4, timeout=5)
    assert first.acquire(blocking=False)
    assert second.acquire(blocking=False)

    def score(lock: RedisLock) -> int:
        number = 1 if lock.held_key == key else int(lock.held_key.rsplit(":", 1)[1])
        return int(client.zscore(index, str(number)) or 0)

    def expiry(lock: RedisLock) -> int:
        value = parse_value(client.get(lock.held_key) or b"")
        assert value.expiry_ms is not None
        return value.expiry_ms

    assert score(first) == expiry(first)
    first.extend(50)
    assert score(first) == expiry(first)
    renewed = extend_all(client, [(key, second.held_key, second.token or "", 40_000)])[0]
    assert isinstance(renewed, int)
    assert renewed > 0
    assert score(second) == expiry(second)
    renewed = extend_all(client, [(key, first.held_key, first.token or "", 30_000)])[0]
    assert isinstance(renewed, int)
    assert renewed > 0
    assert score(first) == expiry(first)
    assert atomic.hold(second, 2_000, "{}") > 0
    assert score(second) == expiry(second)
    assert first.held_key == key  # slot 1 is the lock key itself
    assert atomic.hold(first, 3_000, "{}") > 0
    assert score(first) == expiry(first)
    token = first.token
    assert token is not None
    first.detach()
    second.detach()
    RedisLock(client, key, limit=4, token=token).release()  # the owner, by its token
    assert client.zscore(index, "1") == 1  # free: it scores its own number
    assert client.hget(companion_key(key, OWNERS), token) is None


def test_holders_and_a_fixed_token_owner_at_large_n(counted: redis.Redis) -> None:
    """At N = MAX_LIMIT with three holders, holders() reads those three (a bounded number of
    commands, not N) and a fixed-token instance finds, extends and releases its own slot."""
    key = "holders:{large}"
    held = [slots(counted, key, constants.MAX_LIMIT) for _ in range(3)]
    assert all(lock.acquire(blocking=False) for lock in held)
    counted.config_resetstat()
    found = held[0].holders()
    assert {holder.token for holder in found} == {lock.token for lock in held}
    calls = sum(
        int(entry["calls"])
        for name, entry in counted.info("commandstats").items()
        if "config" not in name
    )
    assert calls <= 12
    owner = RedisLock(counted, key, limit=constants.MAX_LIMIT, token=held[2].token)
    assert owner.owned()
    owner.extend()
    owner.release()
    assert not held[2].owned()
    # With the owners' hash lost, the owner is still found among the slots held.
    counted.delete(companion_key(key, OWNERS))
    owner = RedisLock(counted, key, limit=constants.MAX_LIMIT, token=held[1].token)
    owner.release()
    assert not held[1].owned()
    held[0].release()
