"""What a beat group looks like from outside: the slot a task was sent for (read from its
message), and the group's leader, replicas and slot records as ``celery locks beat`` shows
them (read from the lock Redis, on its clock)."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Any

from celery_singleton_lock.beat.slots import from_ms
from celery_singleton_lock.engine import beat as engine
from celery_singleton_lock.engine.value import parse_value
from celery_singleton_lock.engine.wire import LockClient, call, server_time

__all__ = ["BeatSlot", "GroupState", "Replica", "read_group", "scheduled_slot"]

#: The message header the leader adds (``scheduler.HEADER``; repeated here so reading it
#: does not import the scheduler).
_HEADER = "csl_beat"


@dataclass(frozen=True)
class BeatSlot:
    """The slot a task was sent for: the beat ``group``, the schedule ``entry``, its
    ``scheduled`` time (aware UTC), the ``replica`` that sent it with its lease's
    ``fencing_token``, and whether it was ``caught_up`` (sent late by the catch-up rule)."""

    group: str
    entry: str
    scheduled: dt.datetime
    replica: str
    fencing_token: int
    caught_up: bool
    sent_at: float | None = None


def scheduled_slot(request: Any) -> BeatSlot | None:
    """The slot the running task was sent for by a ``LeaderScheduler`` (``self.request``
    of a bound task, or ``current_task.request``), None for a task not sent by one."""
    found = getattr(request, _HEADER, None)
    if found is None:
        headers = getattr(request, "headers", None)
        found = headers.get(_HEADER) if isinstance(headers, dict) else None
    if not isinstance(found, dict):
        return None
    try:
        sent_at = found.get("sent_at")
        return BeatSlot(
            group=str(found["group"]),
            entry=str(found["entry"]),
            scheduled=from_ms(int(found["slot"])),
            replica=str(found["replica"]),
            fencing_token=int(found["fence"]),
            caught_up=bool(found.get("caught_up", False)),
            sent_at=float(sent_at) if sent_at is not None else None,
        )
    except (KeyError, TypeError, ValueError):
        return None


@dataclass(frozen=True)
class Replica:
    """One replica's last heartbeat: its id, host, pid, role (``leader`` or ``standby``),
    and how long its heartbeat still counts (seconds)."""

    replica: str
    host: str | None
    pid: int | None
    role: str | None
    seen_for: float
    since: dt.datetime | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "replica": self.replica,
            "host": self.host,
            "pid": self.pid,
            "role": self.role,
            "heartbeat_left": self.seen_for,
            "since": self.since.isoformat() if self.since else None,
        }


@dataclass(frozen=True)
class GroupState:
    """A beat group read from the lock Redis: who leads (``leader``: its replica id,
    host, pid, since when, lease left in seconds and fencing token; None when nobody
    does), the replicas seen lately, and each entry's last slot taken."""

    key: str
    now: dt.datetime
    leader: dict[str, Any] | None
    replicas: list[Replica] = field(default_factory=list)
    slots: dict[str, engine.Record] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "now": self.now.isoformat(),
            "leader": self.leader,
            "replicas": [replica.as_json() for replica in self.replicas],
            "slots": {
                name: {
                    "slot": from_ms(record.slot).isoformat(),
                    "state": _STATES[record.state],
                    "fencing_token": record.fence,
                    "at": from_ms(record.at).isoformat(),
                }
                for name, record in sorted(self.slots.items())
            },
        }


_STATES = {
    engine.CLAIMED: "claimed",
    engine.SENT: "sent",
    engine.SKIPPED: "skipped",
    engine.GIVEN_BACK: "given back",
}


def state_name(record: engine.Record) -> str:
    """How a record's state reads: claimed, sent, skipped or given back."""
    return _STATES[record.state]


def _text(raw: Any) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


def _replicas(flat: Any, now_ms: int) -> list[Replica]:
    pairs = flat.items() if isinstance(flat, dict) else []
    found = []
    for name, raw in pairs:
        until, _, text = _text(raw).partition(":")
        if not until.isdigit() or int(until) <= now_ms:
            continue
        try:
            info = json.loads(text)
        except ValueError:
            info = {}
        info = info if isinstance(info, dict) else {}
        since = info.get("since")
        pid = info.get("pid")
        found.append(
            Replica(
                replica=_text(name),
                host=info.get("host"),
                pid=pid if isinstance(pid, int) else None,
                role=info.get("role"),
                seen_for=round((int(until) - now_ms) / 1000, 3),
                since=from_ms(since) if isinstance(since, int) else None,
            )
        )
    found.sort(key=lambda replica: (replica.role != "leader", replica.replica))
    return found


def read_group(client: LockClient, leader_key: str) -> GroupState:
    """The state of the beat group whose leader lease is ``leader_key``: one TIME and one
    pipelined read (the lease, its PTTL, both hashes)."""
    keys = engine.BeatKeys(leader_key)
    now_ms = server_time(client, leader_key)[0]
    pipe = client.pipeline(transaction=False)
    pipe.get(keys.leader)
    pipe.hgetall(keys.replicas)
    pipe.hgetall(keys.slots)
    raw, replicas_raw, slots_raw = call(leader_key, pipe.execute)
    replicas = _replicas(replicas_raw, now_ms)
    leader = None
    if raw is not None:
        value = parse_value(raw)
        holder = value.holder(now_ms, None)
        if holder is not None and not holder.classic:
            info = holder.info
            replica = info.get("beat")
            since = next((r.since for r in replicas if r.replica == replica), None)
            leader = {
                "replica": replica,
                "host": info.get("host"),
                "pid": info.get("pid"),
                "since": since.isoformat() if since else None,
                "lease_left": round((holder.remaining_ms or 0) / 1000, 3),
                "fencing_token": holder.fence,
            }
    return GroupState(
        key=leader_key,
        now=from_ms(now_ms),
        leader=leader,
        replicas=replicas,
        slots=engine.parse_records(slots_raw or {}),
    )
