"""The records of one run (a scenario, or the modes part of a soak), as the checker reads
them. Every time is ``time.monotonic()`` seconds: one clock for every process of the host,
which no fault shifts (the soak's skewed worker shifts only the wall clock).

- :class:`Call`: one ``apply_async`` the driver made, and what it returned (or raised);
- :class:`BodyRun`: one run of a task body (start, end, how it ended, the lease it held);
- :class:`Exec`: one execution of a task in a pool process (task_prerun to task_postrun),
  lock waits included: how busy each worker was;
- :class:`Publish`: a message was published (by the driver or by a worker);
- :class:`Receipt`: a worker's consumer took a message from the broker;
- :class:`SignalRecord`: a lock signal (``lock_superseded``, ``lock_debounced``, ...);
- :class:`Kill`: a process the fault injector killed, and when;
- :class:`Outcome`: the state of a task id in the result backend (and its skip record);
- :class:`FaultRecord`: one injected fault;
- :class:`Observation`: all of it, plus the run's set-up; JSON in and out.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "BodyRun",
    "Call",
    "Exec",
    "FaultRecord",
    "Kill",
    "Observation",
    "Outcome",
    "Publish",
    "Receipt",
    "SignalRecord",
    "WorkerInfo",
]


@dataclass
class Call:
    """One call of a mode's task by the driver."""

    i: int
    mode: str
    key: str
    n: int
    seconds: float
    own_id: str  # the task_id the driver passed
    t_call: float
    t_return: float = 0.0
    result_id: str | None = None  # the AsyncResult's id (None when apply_async raised)
    error: str | None = None  # type name of what apply_async raised
    error_text: str = ""
    fail: bool = False
    countdown: float | None = None
    eta: float | None = None  # seconds from the call (passed as an absolute eta)
    duplicate: bool = False  # the driver published this call's message twice


@dataclass
class BodyRun:
    """One run of a task body."""

    id: str
    task_id: str
    mode: str
    key: str
    n: int
    pid: int
    worker: str
    start: float
    end: float | None = None
    #: ok | fail | lease_lost | terminated (SIGTERM) | killed (SIGKILL by the injector) |
    #: vanished (its process died otherwise) | None (still running when read)
    how: str | None = None
    #: The last moment the body checked that its lease was not lost (None: no lock held).
    trusted: float | None = None
    token: int | None = None
    retries: int = 0

    @property
    def completed(self) -> bool:
        """The body ran to its end (returned or raised by itself)."""
        return self.how in ("ok", "fail", "lease_lost")

    def until(self) -> float | None:
        """Until when it may be counted as holding its key: its end, or, when its lease
        was lost, the last moment it had checked the lease."""
        if self.how == "lease_lost" and self.trusted is not None:
            return self.trusted
        return self.end


@dataclass
class Exec:
    """A task's execution in a pool process: from task_prerun to task_postrun."""

    task_id: str
    name: str
    pid: int
    worker: str
    start: float
    end: float | None = None
    retries: int = 0  # request.retries of this attempt


@dataclass
class Receipt:
    """A worker took a message from the broker (``task_received``)."""

    task_id: str
    name: str
    worker: str
    t: float
    generation: int | None = None  # the debounce generation the message carries
    #: The broker brought the message back (kombu's Redis transport restores what a dead
    #: worker left unacknowledged, marked ``redelivered``).
    redelivered: bool = False
    eta: bool = False  # the message has an ETA (a countdown)
    lock_retries: int = 0  # the retries the lock itself asked for (its header)


@dataclass
class Publish:
    """A message of a mode's task was published (``after_task_publish``), by any process:
    the driver, or a worker publishing a retry or a follow-up."""

    task_id: str
    name: str
    t: float
    worker: str
    eta: bool = False  # with an ETA (a countdown): it waits in the worker that takes it


@dataclass
class SignalRecord:
    """A lock signal, as a receiver in some process recorded it."""

    signal: str
    key: str
    task_id: str | None
    t: float
    pid: int
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass
class Kill:
    """A process the fault injector killed (SIGKILL), and the moment just before."""

    pid: int
    t: float
    kind: str


@dataclass
class Outcome:
    """What the result backend says about a task id."""

    task_id: str
    state: str  # PENDING when nothing was stored
    value: Any = None  # the result (a body returns its call number n)
    error: str | None = None  # exception type name (FAILURE, REVOKED)
    error_text: str = ""
    seen: float | None = None  # when the driver first saw it in a ready state
    skip_holder: str | None = None  # skip_info(result).holder_task_id
    skip_reason: str | None = None  # skip_info(result).reason; None: no skip record


@dataclass
class FaultRecord:
    """One injected fault: ``t0`` when it began, ``t1`` when it was lifted."""

    kind: str
    t0: float
    t1: float
    target: str = ""
    detail: str = ""
    pids: list[int] = field(default_factory=list)


@dataclass
class WorkerInfo:
    """A worker of the run: pool and concurrency (the same after a restart)."""

    name: str
    pool: str
    concurrency: int
    prefetch: int = 1


@dataclass
class Observation:
    """Everything one run recorded."""

    seed: int | None
    lease: float
    visibility_timeout: float
    calls: list[Call] = field(default_factory=list)
    bodies: list[BodyRun] = field(default_factory=list)
    execs: list[Exec] = field(default_factory=list)
    receipts: list[Receipt] = field(default_factory=list)
    published: list[Publish] = field(default_factory=list)
    signals: list[SignalRecord] = field(default_factory=list)
    kills: list[Kill] = field(default_factory=list)
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    faults: list[FaultRecord] = field(default_factory=list)
    workers: list[WorkerInfo] = field(default_factory=list)
    #: When the records were read (the end of the bounded wait).
    ended: float = 0.0
    #: Whether stalls and kills may legitimately cost a holder its lease (the soak's
    #: worker pauses and network stalls past the lease); the invariant runner's faults
    #: never last a lease, so a lost lease there is itself a finding.
    leases_may_be_lost: bool = False
    notes: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """A JSON-able form."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Observation:
        """Read back :meth:`to_json`."""
        data = dict(raw)
        lists: dict[str, type[Any]] = {
            "calls": Call, "bodies": BodyRun, "execs": Exec, "receipts": Receipt,
            "signals": SignalRecord, "kills": Kill, "faults": FaultRecord,
            "workers": WorkerInfo, "published": Publish,
        }  # fmt: skip
        for name, kind in lists.items():
            data[name] = [kind(**item) for item in data.get(name, [])]
        data["outcomes"] = {
            task_id: Outcome(**item) for task_id, item in data.get("outcomes", {}).items()
        }
        return cls(**data)

    def dump(self, path: Path) -> None:
        """Write the JSON form to ``path``."""
        path.write_text(json.dumps(self.to_json(), default=str) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> Observation:
        """Read an observation written by :meth:`dump`."""
        return cls.from_json(json.loads(path.read_text(encoding="utf-8")))
