"""What the modes' task bodies, the lock signals and the worker hooks write to the ledger.

The ledger is a redis-server that no fault touches (never the lock Redis: it is stalled and
restarted). Every record is a JSON line in a list under ``<namespace>:``; one
:class:`Recorder` per app, one client per process (rebuilt after fork). Times are
``time.monotonic()``.

A body (:meth:`Recorder.body`) records its start once it runs (after its lock was taken),
then runs ``seconds``, checking every 50 ms that its lease is not lost, and records its end
before it returns, so before the lock is released: two bodies whose recorded intervals
intersect were really running at once. A pool process terminated by SIGTERM (``revoke(
terminate=True)``, as ``lock_replace_running`` does) records its end from the signal
handler; a SIGKILLed one cannot, so the fault injector records the kill (:meth:`kill`).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

import redis
from celery import signals as celery_signals

from celery_singleton_lock import current_lock
from celery_singleton_lock import signals as lock_signals
from tests.invariants.records import BodyRun, Exec, Kill, Publish, Receipt, SignalRecord

if TYPE_CHECKING:
    from celery import Task

    AnyTask = Task[Any, Any]
else:
    AnyTask = Any

__all__ = ["HEADER_DEBOUNCE", "Recorded", "Recorder"]

#: The message header carrying a debounced call's burst generation (the package's).
HEADER_DEBOUNCE = "singleton_lock_debounce"
#: The message header counting the retries the lock itself asked for (the package's).
HEADER_LOCK_RETRIES = "singleton_lock_retries"
#: How often a body checks its lease (seconds).
STEP = 0.05
#: The lock signals recorded, with the fields kept from each.
RECORDED_SIGNALS = (
    "lock_superseded",
    "lock_debounced",
    "lock_coalesced",
    "lock_throttled",
    "lock_lost",
    "lock_conflict",
    "lock_parked",
)


#: Seconds from a kill's record to the moment its SIGKILL has surely landed.
KILL_LANDS = 0.5


class Recorded:
    """Everything a :class:`Recorder` wrote, read back."""

    def __init__(
        self,
        bodies: list[BodyRun],
        execs: list[Exec],
        receipts: list[Receipt],
        signals: list[SignalRecord],
        kills: list[Kill],
        published: list[Publish],
    ) -> None:
        self.bodies = bodies
        self.execs = execs
        self.receipts = receipts
        self.signals = signals
        self.kills = kills
        self.published = published


class Recorder:
    """Writes (and reads) the ledger of the modes' tasks named ``<prefix>.*``."""

    def __init__(self, url: str, namespace: str, prefix: str, worker: str) -> None:
        self.url = url
        self.ns = namespace
        self.prefix = prefix
        self.worker = worker
        self._clients: dict[int, Any] = {}
        self._mutex = threading.Lock()

    # -- plumbing ---------------------------------------------------------------------

    def client(self) -> Any:
        """This process's ledger client (decoded replies)."""
        pid = os.getpid()
        with self._mutex:
            found = self._clients.get(pid)
            if found is None:
                found = redis.Redis.from_url(self.url, decode_responses=True, socket_timeout=10)
                self._clients = {pid: found}
            return found

    def key(self, name: str) -> str:
        """A ledger key of this recorder."""
        return f"{self.ns}:{name}"

    def _push(self, name: str, record: dict[str, Any]) -> None:
        self.client().rpush(self.key(name), json.dumps(record, default=str))

    def ours(self, task_name: Any) -> bool:
        """Whether ``task_name`` is one of the modes' tasks."""
        return isinstance(task_name, str) and task_name.startswith(self.prefix + ".")

    # -- the body ----------------------------------------------------------------------

    def body(self, task: AnyTask, mode: str, key: str, n: int, seconds: float, fail: bool) -> int:
        """The body of every mode's task (see the module docstring); returns ``n``."""
        lock = current_lock()
        body_id = uuid.uuid4().hex
        start = time.monotonic()
        request = task.request
        self._push(
            "starts",
            {
                "id": body_id, "task_id": str(request.id), "mode": mode, "key": key, "n": n,
                "pid": os.getpid(), "worker": self.worker, "start": start,
                "token": lock.fencing_token if lock is not None else None,
                "retries": int(request.retries or 0),
            },
        )  # fmt: skip
        restore = self._on_sigterm(body_id)
        how = "fail" if fail else "ok"
        trusted = start if lock is not None else None
        try:
            deadline = start + seconds
            while True:
                now = time.monotonic()
                if lock is not None:
                    if lock.lease_lost:
                        how = "lease_lost"
                        break
                    trusted = now
                if now >= deadline:
                    break
                time.sleep(min(STEP, deadline - now))
            end = time.monotonic()
            self._push("ends", {"id": body_id, "end": end, "how": how, "trusted": trusted})
        finally:
            if restore is not None:
                restore()
        if fail and how == "fail":
            raise RuntimeError(f"call {n} fails on purpose")
        return n

    def _on_sigterm(self, body_id: str) -> Callable[[], None] | None:
        """In a pool process's main thread: record this body's end when SIGTERM comes
        (``revoke(terminate=True)``), then act as before: billiard's handler raises
        SystemExit in the body, the default action ends the process. Returns the undo."""
        if threading.current_thread() is not threading.main_thread():
            return None
        previous = signal.getsignal(signal.SIGTERM)
        if previous is signal.SIG_IGN or previous is None:
            return None
        url, ends = self.url, self.key("ends")

        def terminated(signum: int, frame: FrameType | None) -> None:
            at = time.monotonic()
            signal.signal(signal.SIGTERM, previous)
            try:
                with redis.Redis.from_url(url, socket_timeout=2) as client:
                    record = {"id": body_id, "end": at, "how": "terminated", "trusted": at}
                    client.rpush(ends, json.dumps(record))
            finally:
                if callable(previous):
                    previous(signum, frame)
                else:
                    os.kill(os.getpid(), signal.SIGTERM)

        def restore() -> None:
            signal.signal(signal.SIGTERM, previous)

        signal.signal(signal.SIGTERM, terminated)
        return restore

    # -- hooks -------------------------------------------------------------------------

    def connect(self) -> None:
        """Record the lock signals, receipts and executions of the modes' tasks (in every
        process that imports the app: the driver, the workers, their pool processes)."""
        uid = f"invariants.{self.ns}.{self.prefix}"
        for name in RECORDED_SIGNALS:
            getattr(lock_signals, name).connect(
                self._signal_receiver(name), weak=False, dispatch_uid=f"{uid}.{name}"
            )
        celery_signals.task_received.connect(
            self._received, weak=False, dispatch_uid=f"{uid}.received"
        )
        celery_signals.after_task_publish.connect(
            self._published, weak=False, dispatch_uid=f"{uid}.published"
        )
        celery_signals.task_prerun.connect(self._prerun, weak=False, dispatch_uid=f"{uid}.pre")
        celery_signals.task_postrun.connect(self._postrun, weak=False, dispatch_uid=f"{uid}.post")

    def _signal_receiver(self, name: str) -> Callable[..., None]:
        def receive(sender: Any = None, **kwargs: Any) -> None:
            if not self.ours(getattr(sender, "name", None)):
                return
            kwargs.pop("signal", None)
            record = {
                "signal": name, "key": str(kwargs.pop("key", "")),
                "task_id": kwargs.pop("task_id", None), "t": time.monotonic(),
                "pid": os.getpid(), "fields": kwargs,
            }  # fmt: skip
            self._push("signals", record)

        return receive

    def _received(self, sender: Any = None, request: Any = None, **_: Any) -> None:
        if request is None or not self.ours(getattr(request, "name", None)):
            return
        headers = getattr(request, "_request_dict", None) or {}
        generation = headers.get(HEADER_DEBOUNCE)
        self._push(
            "received",
            {
                "task_id": str(request.id), "name": request.name, "worker": self.worker,
                "t": time.monotonic(),
                "generation": int(generation) if generation is not None else None,
                "redelivered": bool(headers.get("redelivered")),
                "eta": bool(headers.get("eta")),
                "lock_retries": int(headers.get(HEADER_LOCK_RETRIES) or 0),
            },
        )  # fmt: skip

    def _published(self, sender: Any = None, headers: Any = None, **_: Any) -> None:
        headers = headers or {}
        if self.ours(headers.get("task")) and headers.get("id"):
            record = {"task_id": str(headers["id"]), "name": headers["task"],
                      "t": time.monotonic(), "worker": self.worker,
                      "eta": bool(headers.get("eta"))}  # fmt: skip
            self._push("published", record)

    def _prerun(self, sender: Any = None, task_id: Any = None, **_: Any) -> None:
        if self.ours(getattr(sender, "name", None)):
            retries = int(getattr(sender.request, "retries", 0) or 0)
            record = {"task_id": str(task_id), "name": sender.name, "pid": os.getpid(),
                      "worker": self.worker, "t": time.monotonic(), "phase": "pre",
                      "retries": retries}  # fmt: skip
            self._push("exec", record)

    def _postrun(self, sender: Any = None, task_id: Any = None, **_: Any) -> None:
        if self.ours(getattr(sender, "name", None)):
            record = {"task_id": str(task_id), "name": sender.name, "pid": os.getpid(),
                      "worker": self.worker, "t": time.monotonic(), "phase": "post"}  # fmt: skip
            self._push("exec", record)

    # -- the driver's side ---------------------------------------------------------------

    def kill(self, pids: list[int], at: float, kind: str) -> None:
        """The fault injector is about to SIGKILL ``pids`` (recorded first)."""
        for pid in pids:
            self._push("kills", {"pid": pid, "t": at, "kind": kind})

    def parked_now(self) -> list[tuple[SignalRecord, str | None]]:
        """The last ``lock_parked`` of each call that has not been published again nor
        started a body since (it waits, parked), with the worker that last took a message
        of that call off the broker (None: none did): for the fault injector to kill that
        worker while the call waits. An ETA message published for it (a retry with a
        countdown) does not end the wait: that is how a call waits in a worker. Calls held
        back by a limit or a rate (position 0) come first, oldest first."""
        client = self.client()
        parked: dict[str, SignalRecord] = {}
        for raw in client.lrange(self.key("signals"), 0, -1):
            record = SignalRecord(**json.loads(raw))
            if record.signal == "lock_parked" and record.task_id:
                parked[record.task_id] = record
        for raw in client.lrange(self.key("published"), 0, -1):
            sent = json.loads(raw)
            found = parked.get(sent["task_id"])
            if found is not None and sent["t"] > found.t and not sent.get("eta"):
                del parked[sent["task_id"]]
        for raw in client.lrange(self.key("starts"), 0, -1):
            start = json.loads(raw)
            found = parked.get(start["task_id"])
            if found is not None and start["start"] > found.t:
                del parked[start["task_id"]]
        taken: dict[str, str] = {}
        for raw in client.lrange(self.key("received"), 0, -1):
            receipt = json.loads(raw)
            if receipt["task_id"] in parked:
                taken[receipt["task_id"]] = receipt["worker"]
        ordered = sorted(parked.values(), key=lambda r: (r.fields.get("position") != 0, r.t))
        return [(record, taken.get(str(record.task_id))) for record in ordered]

    def kills(self) -> list[Kill]:
        """The kills recorded so far."""
        return [Kill(**json.loads(raw)) for raw in self.client().lrange(self.key("kills"), 0, -1)]

    def open_bodies(self) -> list[BodyRun]:
        """Bodies that started, recorded no end (yet), and whose process we did not kill."""
        return [body for body in self.read_bodies(self.kills()) if body.end is None]

    def read_bodies(self, kills: list[Kill] | None = None) -> list[BodyRun]:
        """Every body, its end filled in from its end record, or from a kill of its process
        after it started (``how="killed"``)."""
        client = self.client()
        starts = [json.loads(raw) for raw in client.lrange(self.key("starts"), 0, -1)]
        ends: dict[str, dict[str, Any]] = {}
        for raw in client.lrange(self.key("ends"), 0, -1):
            record = json.loads(raw)
            ends.setdefault(record["id"], record)  # the first end a body recorded counts
        bodies = []
        for record in starts:
            body = BodyRun(**record)
            end = ends.get(body.id)
            if end is not None:
                body.end, body.how, body.trusted = end["end"], end["how"], end.get("trusted")
            bodies.append(body)
        for body in bodies:
            if body.end is not None:
                continue
            for kill in kills or []:
                # The kill is recorded just before the signal is sent: a body may still
                # record its start in the moment until the signal lands.
                if kill.pid == body.pid and kill.t + KILL_LANDS >= body.start:
                    body.end, body.how = max(kill.t, body.start), "killed"
                    break
        return bodies

    def read(self) -> Recorded:
        """Everything recorded."""
        client = self.client()
        kills = self.kills()
        execs: list[Exec] = []
        open_execs: dict[tuple[str, int], Exec] = {}
        for raw in client.lrange(self.key("exec"), 0, -1):
            record = json.loads(raw)
            slot = (record["task_id"], record["pid"])
            if record["phase"] == "pre":
                item = Exec(record["task_id"], record["name"], record["pid"], record["worker"],
                            record["t"], retries=record.get("retries", 0))  # fmt: skip
                execs.append(item)
                open_execs[slot] = item
            elif slot in open_execs:
                open_execs.pop(slot).end = record["t"]
        for item in execs:
            if item.end is None:
                died = [kill.t for kill in kills if kill.pid == item.pid and kill.t >= item.start]
                item.end = min(died) if died else None
        receipts = [
            Receipt(**json.loads(raw)) for raw in client.lrange(self.key("received"), 0, -1)
        ]
        signals = [
            SignalRecord(**json.loads(raw)) for raw in client.lrange(self.key("signals"), 0, -1)
        ]
        published = [
            Publish(**json.loads(raw)) for raw in client.lrange(self.key("published"), 0, -1)
        ]
        return Recorded(self.read_bodies(kills), execs, receipts, signals, kills, published)
