"""The soak's ledger: what every task body did, kept in a Redis that no fault touches.

The lock Redis is faulted (stopped, restarted empty), so nothing the soak judges by may live
there. The ledger is a private ``redis-server`` of its own; every process of the soak (the
driver, the beat, every pool process) writes to it:

- ``sent``: every task id that was published (``after_task_publish`` in the producing
  process: the driver, the beat, a worker publishing a retry), with its task and key;
- ``received``: every task id a worker's consumer took from the broker (``task_received``),
  so a message lost on its way from the broker to a worker can be told apart;
- one record per *body* (a run of a task body): its task id, key, fencing token, process,
  worker, the wall-clock offset of its process, and the CLOCK_MONOTONIC times at which it
  entered and was last known to hold its lease (``enter``, ``last``), how it ended;
- a fenced resource per lock key: each write a body makes (enter, heartbeat, commit) is
  refused when its fencing token is lower than the highest token that ever wrote there;
- a read-increment-write counter per lock key: a body reads it at enter and writes
  ``seen + 1`` at commit; a commit that finds another value lost an update;
- ``commits`` and ``skips`` per task id (the exactly-once ledger), the ``lock_lost``
  signals, and the holds a body found missing while its lease was still valid.

Times are ``time.monotonic()`` seconds: one clock for every process of the host, which the
soak's skewed-clock worker does not touch (it shifts only the wall clock).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import redis

__all__ = ["Body", "Ledger", "Snapshot"]

# KEYS[1] fence:<key>  KEYS[2] body:<id>  KEYS[3] counter:<key>  KEYS[4] stale (list)
# ARGV[1] token  ARGV[2] t (monotonic)  ARGV[3] enter | beat | commit  ARGV[4] seen (commit)
# ARGV[5] body id  ARGV[6] key
# returns {0, fence}    refused: a higher token wrote here before (recorded in ``stale``)
#         {1, counter}  accepted (enter: the counter this body read; commit: the counter
#                       it found before writing seen + 1)
_FENCED = """
local fence = redis.call('GET', KEYS[1])
local token = tonumber(ARGV[1])
if fence and token < tonumber(fence) then
  redis.call('RPUSH', KEYS[4], cjson.encode({body = ARGV[5], key = ARGV[6], token = ARGV[1],
    fence = fence, t = ARGV[2], what = ARGV[3]}))
  return {0, fence}
end
if not fence or token > tonumber(fence) then redis.call('SET', KEYS[1], ARGV[1]) end
local counter = redis.call('GET', KEYS[3]) or '0'
if ARGV[3] == 'enter' then
  redis.call('HSET', KEYS[2], 'enter', ARGV[2], 'last', ARGV[2], 'seen', counter)
elseif ARGV[3] == 'commit' then
  redis.call('HSET', KEYS[2], 'last', ARGV[2], 'found', counter)
  redis.call('SET', KEYS[3], tonumber(ARGV[4]) + 1)
else
  redis.call('HSET', KEYS[2], 'last', ARGV[2])
end
return {1, counter}
"""


@dataclass
class Body:
    """One run of a task body, as the ledger knows it."""

    id: str
    task_id: str
    kind: str
    key: str
    token: int
    pid: int
    worker: str
    wall_offset: float = 0.0  # this process's time.time() minus the ledger server's clock
    enter: float | None = None  # accepted enter (monotonic)
    last: float | None = None  # last accepted write: the hold was trusted until then
    seen: int | None = None
    found: int | None = None  # the counter its commit found (lost update if != seen)
    outcome: str | None = None  # committed | lease_lost | refused | missing
    exit: float | None = None
    audited: bool = False  # asked the lock Redis whether it still had the hold

    @classmethod
    def from_hash(cls, body_id: str, raw: Mapping[str, str]) -> Body:
        """A body from its ledger hash."""

        def number(name: str) -> float | None:
            value = raw.get(name)
            return float(value) if value not in (None, "") else None

        def integer(name: str) -> int | None:
            value = raw.get(name)
            return int(float(value)) if value not in (None, "") else None

        return cls(
            id=body_id, task_id=raw.get("task_id", ""), kind=raw.get("kind", ""),
            key=raw.get("key", ""), token=int(raw.get("token", "0")),
            pid=int(raw.get("pid", "0")), worker=raw.get("worker", ""),
            wall_offset=float(raw.get("wall_offset", "0")), enter=number("enter"),
            last=number("last"), seen=integer("seen"), found=integer("found"),
            outcome=raw.get("outcome"), exit=number("exit"), audited=raw.get("audited") == "1",
        )  # fmt: skip


@dataclass
class Snapshot:
    """Everything the ledger holds, read once at the end of a soak."""

    sent: dict[str, dict[str, Any]] = field(default_factory=dict)
    received: dict[str, dict[str, Any]] = field(default_factory=dict)
    bodies: list[Body] = field(default_factory=list)
    commits: dict[str, int] = field(default_factory=dict)
    skips: dict[str, int] = field(default_factory=dict)
    stale: list[dict[str, Any]] = field(default_factory=list)
    lost_signals: list[dict[str, Any]] = field(default_factory=list)


class Ledger:
    """A client of the ledger Redis; one per process (:meth:`for_process`)."""

    _instances: dict[tuple[int, str], Ledger] = {}  # noqa: RUF012 - per process and URL
    _guard = threading.Lock()

    def __init__(self, url: str) -> None:
        self.url = url
        # decode_responses: every reply is str (redis-py's types cannot say so).
        self.client: Any = redis.Redis.from_url(url, decode_responses=True, socket_timeout=10)
        self._fenced = self.client.register_script(_FENCED)

    @classmethod
    def for_process(cls, url: str | None = None) -> Ledger:
        """This process's ledger client for ``url`` (default ``$CSL_SOAK_LEDGER``),
        rebuilt after fork."""
        url = url or os.environ["CSL_SOAK_LEDGER"]
        with cls._guard:
            key = (os.getpid(), url)
            ledger = cls._instances.get(key)
            if ledger is None:
                ledger = cls._instances[key] = cls(url)
            return ledger

    # -- written by producers -----------------------------------------------------------

    def sent(self, task_id: str, task: str, key: str, at: float, by: str) -> None:
        """``task_id`` was published (the first publish of an id counts; retries keep it)."""
        record = json.dumps({"task": task, "key": key, "t": at, "by": by})
        self.client.hsetnx("sent", task_id, record)

    def received(self, task_id: str, worker: str, at: float) -> None:
        """A worker's consumer took ``task_id`` from the broker (the first time counts)."""
        self.client.hsetnx("received", task_id, json.dumps({"worker": worker, "t": at}))

    def in_flight(self) -> int:
        """Published task ids not yet committed or skipped."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hlen("sent")
        pipe.scard("done")
        sent, done = pipe.execute()
        return int(sent) - int(done)

    def unreceived_in_flight(self) -> tuple[int, int]:
        """(published task ids not yet done, those of them no worker ever received)."""
        client = self.client
        pending = set(client.hkeys("sent")) - set(client.smembers("done"))
        received = set(client.hkeys("received")) if pending else set()
        return len(pending), len(pending - received)

    # -- written by bodies ----------------------------------------------------------------

    def open(self, body: Body, wall: float) -> None:
        """Record a body about to enter (its fields, and its process's clock offset)."""
        seconds, micros = self.client.time()
        body.wall_offset = wall - (int(seconds) + int(micros) / 1e6)
        pipe = self.client.pipeline(transaction=False)
        pipe.hset(
            f"body:{body.id}",
            mapping={
                "task_id": body.task_id, "kind": body.kind, "key": body.key,
                "token": str(body.token), "pid": str(body.pid), "worker": body.worker,
                "wall_offset": repr(body.wall_offset),
            },
        )  # fmt: skip
        pipe.rpush("bodies", body.id)
        pipe.execute()

    def write(self, body: Body, what: str, at: float, seen: int = 0) -> tuple[bool, int]:
        """A fenced write of ``body`` (``enter``, ``beat`` or ``commit``) at monotonic
        ``at``: (accepted, counter) or (False, the fence that refused it)."""
        keys = [f"fence:{body.key}", f"body:{body.id}", f"counter:{body.key}", "stale"]
        args: list[str | int] = [body.token, repr(at), what, seen, body.id, body.key]
        accepted, number = cast("list[Any]", self._fenced(keys=keys, args=args))
        if accepted and what == "enter":
            self.client.hset("active", body.id, json.dumps([body.key, body.pid, body.worker]))
        return bool(accepted), int(number)

    def close(self, body: Body, outcome: str, at: float, *, committed: bool) -> None:
        """The body ended: how, and whether its task now counts as done."""
        pipe = self.client.pipeline(transaction=True)
        fields = {"outcome": outcome, "exit": repr(at), "audited": "1" if body.audited else "0"}
        pipe.hset(f"body:{body.id}", mapping=fields)
        pipe.hdel("active", body.id)
        if committed:
            pipe.hincrby("commits", body.task_id, 1)
            pipe.sadd("done", body.task_id)
        pipe.execute()

    def skipped(self, task_id: str) -> None:
        """A run of ``task_id`` was skipped by its conflict policy (by design, not lost)."""
        pipe = self.client.pipeline(transaction=True)
        pipe.hincrby("skips", task_id, 1)
        pipe.sadd("done", task_id)
        pipe.execute()

    def lost_signal(self, task_id: str, token: int | None, key: str, at: float) -> None:
        """The ``lock_lost`` signal told ``task_id``'s run that its lease was lost."""
        record = {"task_id": task_id, "token": token, "key": key, "t": at}
        self.client.rpush("lost_signals", json.dumps(record))

    # -- read by the driver ----------------------------------------------------------------

    def active(self) -> dict[str, tuple[str, int, str]]:
        """Bodies that entered and have not ended: id -> (key, pid, worker). A killed
        body stays here; callers check its process."""
        raw = self.client.hgetall("active")
        return {body: cast("tuple[str, int, str]", tuple(json.loads(v))) for body, v in raw.items()}

    def snapshot(self) -> Snapshot:
        """Everything recorded so far."""
        client = self.client
        ids = client.lrange("bodies", 0, -1)
        pipe = client.pipeline(transaction=False)
        for body_id in ids:
            pipe.hgetall(f"body:{body_id}")
        raws = pipe.execute() if ids else []
        return Snapshot(
            sent={task: json.loads(v) for task, v in client.hgetall("sent").items()},
            received={task: json.loads(v) for task, v in client.hgetall("received").items()},
            bodies=[Body.from_hash(i, raw) for i, raw in zip(ids, raws, strict=True)],
            commits={task: int(v) for task, v in client.hgetall("commits").items()},
            skips={task: int(v) for task, v in client.hgetall("skips").items()},
            stale=[json.loads(item) for item in client.lrange("stale", 0, -1)],
            lost_signals=[json.loads(item) for item in client.lrange("lost_signals", 0, -1)],
        )
