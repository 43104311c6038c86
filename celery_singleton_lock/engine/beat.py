"""The lock Redis side of a beat group (``celery_singleton_lock.beat``): its keys, the
records of the slots its leaders took, and typed wrappers of its three scripts.

A beat group is led by whoever holds its leader lease, a :class:`~.lock.RedisLock` on
:attr:`BeatKeys.leader`. Beside it, in its Redis Cluster hash slot, a hash keeps per
schedule entry the last slot taken (:class:`Record`), and another the heartbeats of the
group's replicas. Every slot is taken by ``beat_claim`` in one step with the check that
the caller's owner token and fencing token are the lease's and the lease has not run out
on the server's clock, and only if it is later than the entry's last slot taken: so a
deposed leader, or a second one during a failover, never takes a slot twice. Each
script's KEYS / ARGV / reply contract heads its file in ``scripts/``. Imports nothing
from Celery.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from celery_singleton_lock.engine.keyspace import BEAT_REPLICAS, BEAT_SLOTS, companion_key
from celery_singleton_lock.engine.scripts import SCRIPTS
from celery_singleton_lock.engine.wire import LockClient, call

__all__ = [
    "CLAIMED",
    "GIVEN_BACK",
    "SENT",
    "SKIPPED",
    "BeatKeys",
    "Claim",
    "Record",
    "claim",
    "leave",
    "parse_record",
    "parse_records",
    "presence",
    "settle",
]

_CLAIM = SCRIPTS["beat_claim"]
_SETTLE = SCRIPTS["beat_settle"]
_PRESENCE = SCRIPTS["beat_presence"]

#: The states of a slot record: taken to be sent (not known to be published yet), sent,
#: skipped by the catch-up rule, or given back (its publish failed; the slot is free).
CLAIMED, SENT, SKIPPED, GIVEN_BACK = "c", "s", "k", "u"


@dataclass(frozen=True)
class BeatKeys:
    """The keys of the beat group whose leader lease is ``leader``: the slot records and
    the replicas' heartbeats sit beside it, in its hash slot."""

    leader: str

    @property
    def slots(self) -> str:
        return companion_key(self.leader, BEAT_SLOTS)

    @property
    def replicas(self) -> str:
        return companion_key(self.leader, BEAT_REPLICAS)


class Record(NamedTuple):
    """What an entry's record says: the last slot taken (Unix ms of its scheduled time),
    its state (:data:`CLAIMED`, :data:`SENT`, :data:`SKIPPED` or :data:`GIVEN_BACK`), the
    fencing token of the leader that took it, when (server ms), and the slot taken before
    it (None for the entry's first)."""

    slot: int
    state: str
    fence: int
    at: int
    before: int | None

    @property
    def last_taken(self) -> int | None:
        """The latest slot that counts as taken: this one, or for a slot given back the
        one before it."""
        return self.before if self.state == GIVEN_BACK else self.slot


def _text(raw: Any) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


def parse_record(raw: bytes | str) -> Record | None:
    """A record as ``beat_claim`` writes it, None for anything else (never raises)."""
    parts = _text(raw).split(":")
    if len(parts) != 5 or parts[1] not in (CLAIMED, SENT, SKIPPED, GIVEN_BACK):
        return None
    slot, _, fence, at, before = parts
    if not (slot.isdigit() and fence.isdigit() and at.isdigit()):
        return None
    if before and not before.isdigit():
        return None
    return Record(int(slot), parts[1], int(fence), int(at), int(before) if before else None)


def parse_records(flat: Any) -> dict[str, Record]:
    """Entry name -> record from an ``HGETALL`` reply (a flat list or a mapping); fields
    that are not records are left out."""
    pairs = flat.items() if isinstance(flat, dict) else zip(flat[::2], flat[1::2], strict=True)
    found: dict[str, Record] = {}
    for name, raw in pairs:
        record = parse_record(raw)
        if record is not None:
            found[_text(name)] = record
    return found


class Claim(NamedTuple):
    """What ``beat_claim`` answered: ``taken`` (the slot is the caller's now), ``leads``
    (False: the caller does not hold the lease with that fencing token, nothing was
    taken), the server time (ms) it ran at, and, when the entry already took this slot or
    a later one, that entry's record."""

    taken: bool
    leads: bool
    now_ms: int
    record: Record | None = None


def claim(
    client: LockClient,
    keys: BeatKeys,
    *,
    token: str,
    fence: int,
    entry: str,
    slot_ms: int,
    send: bool,
    keep_ms: int,
) -> Claim:
    """Take slot ``slot_ms`` of ``entry`` for the leader holding ``keys.leader`` under
    ``token`` with fencing token ``fence``: to send it (``send``; the record says
    :data:`CLAIMED` until :func:`settle`), or to skip it (:data:`SKIPPED`). The records
    are kept ``keep_ms`` from now. ``ValueError`` for an empty owner token or a fencing
    token below 1 (no lease has them)."""
    if not token or fence < 1:
        raise ValueError(
            f"a claim needs the lease's owner and fencing token, got {token!r}, {fence!r}"
        )
    reply = call(
        keys.leader,
        _CLAIM,
        client,
        2,
        keys.leader,
        keys.slots,
        token,
        fence,
        entry,
        slot_ms,
        CLAIMED if send else SKIPPED,
        keep_ms,
    )
    outcome = int(reply[0])
    if outcome == 1:
        return Claim(taken=True, leads=True, now_ms=int(reply[1]))
    if outcome == -1:
        return Claim(taken=False, leads=False, now_ms=int(reply[1]))
    return Claim(taken=False, leads=True, now_ms=0, record=parse_record(reply[1]))


def settle(
    client: LockClient, keys: BeatKeys, *, entry: str, slot_ms: int, fence: int, sent: bool
) -> bool:
    """Record that the slot ``slot_ms`` of ``entry`` claimed under ``fence`` was sent, or
    give it back (``sent=False``: its publish failed, so it may be taken again). False
    when the record no longer shows that claim (nothing done)."""
    reply = call(
        keys.leader,
        _SETTLE,
        client,
        1,
        keys.slots,
        entry,
        slot_ms,
        fence,
        SENT if sent else GIVEN_BACK,
    )
    return int(reply) == 1


def presence(
    client: LockClient,
    keys: BeatKeys,
    *,
    replica: str,
    info: str,
    ttl_ms: int,
    keep_ms: int,
    leaving: bool = False,
) -> tuple[int, dict[str, Record]]:
    """The heartbeat of ``replica`` (``info``: a JSON text), counted ``ttl_ms``; with
    ``leaving``, its removal. Returns the server time (ms) and every entry's record."""
    reply = call(
        keys.leader,
        _PRESENCE,
        client,
        2,
        keys.replicas,
        keys.slots,
        replica,
        info,
        ttl_ms,
        keep_ms,
        b"1" if leaving else b"0",
    )
    return int(reply[0]), parse_records(reply[1])


def leave(client: LockClient, keys: BeatKeys, *, replica: str, keep_ms: int) -> None:
    """Remove the heartbeat of ``replica`` (it stops)."""
    presence(client, keys, replica=replica, info="", ttl_ms=1, keep_ms=keep_ms, leaving=True)
