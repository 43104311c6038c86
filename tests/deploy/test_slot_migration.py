"""A Redis Cluster slot migration under a held lock, done step by step by the test
(``CLUSTER SETSLOT … IMPORTING/MIGRATING``, ``MIGRATE``, ``CLUSTER SETSLOT … NODE``), so
every intermediate state is reached deterministically.

``MIGRATE`` moves a key with its value and TTL, so a lock and its companion keys (one hash
slot) arrive whole. Midway — the lock key moved, its companions not yet — a contender is
answered "held" or gets a ``LockBackendError`` (Redis answers ``TRYAGAIN`` to a script
whose keys are split between the two nodes, until redis-py's redirections run out): it
never takes the lock. Afterwards the
holder still owns it on the new node, renews and releases it there, and the next holder's
fencing token is larger.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot

from celery_singleton_lock import LockBackendError, RedisLock
from celery_singleton_lock.engine.keyspace import companion_key
from tests.deploy.conftest import Cluster

pytestmark = pytest.mark.slow

NAME = "mig:{slot-moves}"


def _node(port: int) -> redis.Redis:
    return redis.Redis(port=port, socket_timeout=10)


def _owner(cluster: Cluster, slot: int) -> int:
    """Port of the master that serves ``slot``."""
    with _node(cluster.ports[0]) as any_node:
        for start, end, master, *_ in any_node.execute_command("CLUSTER", "SLOTS"):
            if int(start) <= slot <= int(end):
                return int(master[1])
    raise AssertionError(f"no node serves slot {slot}")


def _node_id(port: int) -> str:
    with _node(port) as node:
        raw = node.execute_command("CLUSTER", "MYID")
    return raw.decode() if isinstance(raw, bytes) else str(raw)


@pytest.fixture
def client(cluster: Cluster) -> Iterator[RedisCluster]:
    """A cluster client with the lock's keys removed."""
    conn = RedisCluster(host="127.0.0.1", port=cluster.ports[0], socket_timeout=10)
    conn.delete(NAME, companion_key(NAME, "queue"), companion_key(NAME, "signal"))
    yield conn
    conn.close()


def test_a_held_lock_survives_a_slot_migration_step_by_step(
    cluster: Cluster, client: RedisCluster
) -> None:
    """Held lock; slot set migrating/importing; the lock key moved alone: a contender
    never gets it; the rest moved and the slot handed over: the holder still owns it on the
    new node (same value, a TTL kept), renews and releases it there, and the next holder's
    fencing token is larger."""
    slot = key_slot(NAME.encode())
    source = _owner(cluster, slot)
    target = next(port for port in cluster.ports if port != source)
    source_id, target_id = _node_id(source), _node_id(target)
    holder = RedisLock(client, NAME, timeout=30)
    assert holder.acquire(blocking=False)
    waiter = RedisLock(client, NAME, timeout=30)
    assert not waiter.acquire(timeout=0.2)  # leaves the flag and the waiters' queue behind
    with _node(source) as src, _node(target) as dst:
        value = src.get(NAME)
        keys = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
        assert NAME.encode() in keys
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        src.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", NAME)
        asking = dst.pipeline(transaction=False)  # ASKING holds for the next command
        asking.execute_command("ASKING")
        asking.get(NAME)
        asking.execute_command("ASKING")
        asking.pttl(NAME)
        _, moved_value, _, ttl = asking.execute()
        assert moved_value == value
        assert ttl > 0  # the TTL came along

        # Midway: the lock key is on the target, its companions still on the source.
        rival = RedisLock(client, NAME, timeout=30)
        try:
            midway = rival.acquire(blocking=False)
        except LockBackendError:  # TRYAGAIN until redis-py's redirections run out
            midway = False
        assert not midway

        rest = [key for key in keys if key != NAME.encode()]
        if rest:
            src.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *rest)
        for port in cluster.ports:
            with _node(port) as node:
                node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
        assert src.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
    assert _owner(cluster, slot) == target
    assert holder.owned()
    assert not RedisLock(client, NAME, timeout=30).acquire(blocking=False)
    holder.extend()
    token = holder.fencing_token
    assert token is not None
    holder.release()
    after = RedisLock(client, NAME, timeout=30)
    assert after.acquire(blocking=False)
    assert (after.fencing_token or 0) > token
    after.release()
