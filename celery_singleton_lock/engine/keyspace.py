"""Every Redis key a lock uses besides its own name, in one place.

A lock named ``name`` keeps its companions in the same Redis Cluster hash slot, under the
*base* ``{name}:`` (or ``name:`` when ``name`` already carries a hash tag), so one script can
touch them all. The suffixes below are the only spellings; the Lua scripts get them from
here when they are rendered (see :mod:`.scripts`). This module imports nothing but the
standard library.
"""

from __future__ import annotations

__all__ = [
    "BEAT_REPLICAS",
    "BEAT_SLOTS",
    "BURST",
    "DEBOUNCE",
    "DONE",
    "FENCE",
    "GRANT",
    "GRANTED",
    "HANDED",
    "ORDER",
    "ORDER_DUE",
    "OWNERS",
    "PARKDATA",
    "PARKED",
    "PENDING",
    "QUEUE",
    "SEQ",
    "SIGNAL",
    "SLOT",
    "SLOTS",
    "STACK",
    "STARTS",
    "SUFFIXES",
    "SUPERSEDED",
    "SYNC",
    "WAITER",
    "base_key",
    "companion_key",
    "split_key",
]

#: The waiters' wake-up list (a release pushes onto it).
SIGNAL = "signal"
#: The waiters' queue: a sorted set of owner tokens, oldest first.
QUEUE = "queue"
#: ``waiter:<token>``: a queued waiter says it still waits (lease and holder info).
WAITER = "waiter:"
#: ``grant:<token>``: the list a release pushes onto when it hands the lock to that waiter.
GRANT = "grant:"
#: ``slot:<i>``: slot ``i`` >= 2 of a lock with several slots (slot 1 is the lock key).
SLOT = "slot:"
#: The slot index of a lock with several slots: a sorted set of slot numbers, each scored
#: by the end of the lease it is believed held for (a free slot: its own number).
SLOTS = "slots"
#: Beside the slot index, a hash: owner token -> its slot, and per slot and per group who
#: holds it (``engine/scripts/lib/slots.lua``).
OWNERS = "owners"
#: The highest fencing token issued across a lock's slots.
FENCE = "fence"
#: The marker written before ``WAIT`` for replicas.
SYNC = "sync"
#: The task ids of the key's runs that finished recently: a sorted set (score: server ms).
DONE = "done"
#: The pending follow-up of a key (coalesce, replace): a hash.
PENDING = "pending"
#: The follow-up a hand-over just gave the key to (a hash: the call and the ending run's
#: owner token), kept a short while so a hand-over whose reply was lost can be asked again.
HANDED = "handed"
#: ``superseded:<task id>``: that queued call was superseded by the task id stored there.
SUPERSEDED = "superseded:"
#: A key's open debounce burst: a hash (its task id, generation, first call, due time).
DEBOUNCE = "debounce"
#: ``burst:<task id>``: the latest generation of that debounce burst.
BURST = "burst:"
#: ``stack:<token>``: the stacked limits that hold of the lock has a share of (its spec).
STACK = "stack:"
#: A key's recent starts (``lock_rate_limit``): a sorted set scored by server ms.
STARTS = "starts"
#: A key's park queue (``lock_on_conflict="park"``): a sorted set of task ids by turn.
PARKED = "parked"
#: The parked calls of a key: a hash, task id -> grant token, holder info and the call.
PARKDATA = "parkdata"
#: Parked calls handed the key but not started yet: a sorted set scored by server ms.
GRANTED = "granted"
#: ``lock_order="enqueue"``: the outstanding calls of a key, by turn (a sorted set).
ORDER = "order"
#: ``lock_order="enqueue"``: the deadline of each outstanding call (server ms; a call whose
#: message never comes leaves the line).
ORDER_DUE = "orderdue"
#: ``lock_order="enqueue"``: the counter the calls' turns are taken from.
SEQ = "seq"
#: Beside a beat group's leader lease (``celery_singleton_lock.beat``): a hash, entry name ->
#: the last slot of that schedule entry taken (sent, being sent, or skipped by catch-up).
BEAT_SLOTS = "beat:slots"
#: Beside a beat group's leader lease: the replicas of the group seen lately, a hash of
#: replica id -> its heartbeat.
BEAT_REPLICAS = "beat:replicas"

#: Every suffix, by the name the Lua scripts know it under (``K_<NAME>``).
SUFFIXES = {
    "SIGNAL": SIGNAL,
    "QUEUE": QUEUE,
    "WAITER": WAITER,
    "GRANT": GRANT,
    "SLOT": SLOT,
    "SLOTS": SLOTS,
    "OWNERS": OWNERS,
    "FENCE": FENCE,
    "SYNC": SYNC,
    "DONE": DONE,
    "PENDING": PENDING,
    "HANDED": HANDED,
    "SUPERSEDED": SUPERSEDED,
    "DEBOUNCE": DEBOUNCE,
    "BURST": BURST,
    "STARTS": STARTS,
    "STACK": STACK,
    "PARKED": PARKED,
    "PARKDATA": PARKDATA,
    "GRANTED": GRANTED,
    "ORDER": ORDER,
    "ORDER_DUE": ORDER_DUE,
    "SEQ": SEQ,
    "BEAT_SLOTS": BEAT_SLOTS,
    "BEAT_REPLICAS": BEAT_REPLICAS,
}


def base_key(name: str) -> str:
    """The prefix of every companion of lock ``name``: ``{name}:``, or ``name:`` when
    ``name`` has a hash tag of its own (``{...}`` with something inside).

    A name with a ``}`` but no valid tag cannot be co-located: ``ValueError``.
    """
    start = name.find("{")
    if start != -1:
        end = name.find("}", start + 1)
        if end > start + 1:
            return f"{name}:"
    if "}" in name:
        raise ValueError(
            f"lock name {name!r} contains '}}' without a hash tag; wrap the part that "
            "identifies the lock in braces, e.g. 'orders:{sku-42}'"
        )
    return f"{{{name}}}:"


def companion_key(name: str, suffix: str) -> str:
    """A key that lives in the same Redis Cluster hash slot as lock ``name``."""
    return base_key(name) + suffix


def split_key(key: str) -> tuple[str, str]:
    """``(lock key, suffix)`` of a key read back from Redis, for locks whose name carries a
    hash tag (as every task's key does: ``prefix:task:{digest}``): a lock key has suffix
    ``""``; ``prefix:task:{digest}:slot:2`` gives the lock key and ``"slot:2"``."""
    close = key.find("}")
    if close != -1 and key.startswith(":", close + 1):
        return key[: close + 1], key[close + 2 :]
    return key, ""
