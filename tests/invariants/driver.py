"""The calling side of a run: makes the calls, follows their results, notices dead bodies.

Used by the invariant runner (:mod:`.runner`) and by the chaos soak's modes producer
(``benchmarks/soak/modes.py``). A :class:`Driver` makes one call at a time
(:meth:`Driver.call`), records it as a :class:`~tests.invariants.records.Call`, and,
when the plan says so, publishes the call's message a second time (same task id, body
and headers: a duplicate delivery). :meth:`Driver.poller` polls the result backend for
every id not ready yet and reads ``skip_info`` the moment a call ends without running (a
restart of the lock Redis would lose the skip record). :meth:`Driver.watcher` records the
end of a body whose process died without a kill of ours (``vanished``: the moment it
noticed, an upper bound).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from celery import signals
from celery.result import AsyncResult

from celery_singleton_lock import skip_info
from tests.invariants.recording import Recorder
from tests.invariants.records import Call, Outcome
from tests.invariants.scenario import PlannedCall

if TYPE_CHECKING:
    from celery import Celery, Task

    AnyTask = Task[Any, Any]
else:
    AnyTask = Any

__all__ = ["POLL", "Driver", "alive", "broker_leftovers"]

#: How often the result backend is polled (seconds).
POLL = 0.25
READY = ("SUCCESS", "FAILURE", "REVOKED")

Message = tuple[Any, Any, Any, dict[str, Any], dict[str, Any]]


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _message_id(raw: Any) -> str | None:
    """The task id of a message as kombu's Redis transport stores it (JSON; in the
    ``unacked`` hash, a list whose first item is the message)."""
    try:
        data = json.loads(raw)
    except (TypeError, ValueError):
        return None
    if isinstance(data, list) and data:
        data = data[0]
    if not isinstance(data, dict):
        return None
    task_id = (data.get("headers") or {}).get("id")
    return str(task_id) if task_id else None


def broker_leftovers(client: Any, queue: str) -> dict[str, str]:
    """Task id -> ``queued`` / ``unacknowledged`` for every message still in the broker
    (a Redis broker: the queue's list and kombu's ``unacked`` hash)."""
    left: dict[str, str] = {}
    for raw in client.lrange(queue, 0, -1):
        task_id = _message_id(raw)
        if task_id:
            left[task_id] = "queued"
    for raw in client.hvals("unacked"):
        task_id = _message_id(raw)
        if task_id:
            left[task_id] = "unacknowledged"
    return left


class Driver:
    """The calls of one run, their results, and the watcher of bodies."""

    def __init__(
        self,
        app: Celery,
        tasks: Mapping[str, AnyTask],
        recorder: Recorder,
        say: Callable[[str], None] = print,
    ) -> None:
        self.app = app
        self.tasks = tasks
        self.recorder = recorder
        self.say = say
        self.calls: list[Call] = []
        self.outcomes: dict[str, Outcome] = {}
        self.pending: set[str] = set()
        self.mutex = threading.Lock()
        self.halt = threading.Event()
        #: PIDs the fault injector killed (their bodies are not reported as vanished).
        self.killed: set[int] = set()
        self._capture: list[Message] | None = None
        self._capturing = 0
        signals.before_task_publish.connect(
            self._on_publish, weak=False, dispatch_uid=f"invariants.duplicate.{id(self)}"
        )

    # -- calls ---------------------------------------------------------------------------

    def _on_publish(
        self,
        sender: Any = None,
        body: Any = None,
        exchange: Any = None,
        routing_key: Any = None,
        headers: Any = None,
        properties: Any = None,
        **_: Any,
    ) -> None:
        """``before_task_publish``: keep the messages of a call to publish twice."""
        if self._capture is not None and threading.get_ident() == self._capturing:
            message = (body, exchange, routing_key, dict(headers or {}), dict(properties or {}))
            self._capture.append(message)

    def republish(self, messages: list[Message]) -> None:
        """Publish the captured messages again: same task id, headers and body."""
        with self.app.producer_or_acquire() as producer:
            for body, exchange, routing_key, headers, properties in messages:
                kept = {k: v for k, v in properties.items() if k in ("correlation_id", "reply_to")}
                producer.publish(
                    body, exchange=exchange, routing_key=routing_key, headers=headers,
                    serializer="json", retry=True, **kept,
                )  # fmt: skip

    def call(self, planned: PlannedCall) -> Call:
        """Make one planned call (from one thread at a time)."""
        task = self.tasks[planned.mode]
        own_id = uuid.uuid4().hex
        options: dict[str, Any] = {"task_id": own_id}
        if planned.countdown is not None:
            options["countdown"] = planned.countdown
        if planned.eta is not None:
            options["eta"] = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=planned.eta)
        kwargs = {"fail": True} if planned.fail else {}
        with self.mutex:
            index = len(self.calls)
        record = Call(
            i=index, mode=planned.mode, key=planned.key, n=planned.n, seconds=planned.seconds,
            own_id=own_id, t_call=time.monotonic(), fail=planned.fail,
            countdown=planned.countdown, eta=planned.eta, duplicate=planned.duplicate,
        )  # fmt: skip
        self._capturing = threading.get_ident()
        self._capture = [] if planned.duplicate else None
        try:
            args = (planned.key, planned.n, planned.seconds)
            result = task.apply_async(args, kwargs, **options)
            record.result_id = str(result.id)
        except Exception as exc:  # the caller is told: that is a terminal state
            record.error, record.error_text = type(exc).__name__, str(exc)
        finally:
            captured, self._capture = self._capture, None
        record.t_return = time.monotonic()
        if captured:
            try:
                self.republish(captured)
            except Exception as exc:
                self.say(f"could not publish call {planned.n} again: {exc!r}")
                record.duplicate = False
        else:
            record.duplicate = False  # nothing was published (a follow-up, a refusal)
        with self.mutex:
            self.calls.append(record)
            if record.result_id is not None and record.result_id not in self.outcomes:
                self.pending.add(record.result_id)
        return record

    def waiting(self) -> int:
        """Result ids not ready yet."""
        with self.mutex:
            return len(self.pending)

    # -- the result poller ---------------------------------------------------------------

    def read_outcome(self, task_id: str) -> Outcome | None:
        """The ready state of ``task_id`` (None while it is not ready)."""
        meta = self.app.backend.get_task_meta(task_id)
        state = str(meta.get("status", "PENDING"))
        if state not in READY:
            return None
        value = meta.get("result")
        outcome = Outcome(task_id, state, seen=time.monotonic())
        if isinstance(value, BaseException):
            outcome.error, outcome.error_text = type(value).__name__, str(value)
        else:
            outcome.value = value
        if state == "SUCCESS" and value is None:
            skip = skip_info(AsyncResult(task_id, app=self.app), app=self.app)
            if skip is not None:
                outcome.skip_holder, outcome.skip_reason = skip.holder_task_id, skip.reason
        return outcome

    def poll_once(self) -> None:
        """Read every id not ready yet once."""
        with self.mutex:
            waiting = sorted(self.pending)
        for task_id in waiting:
            outcome = None
            with contextlib.suppress(Exception):  # the lock Redis stalls: next round
                outcome = self.read_outcome(task_id)
            if outcome is not None:
                with self.mutex:
                    self.outcomes[task_id] = outcome
                    self.pending.discard(task_id)

    def poller(self) -> None:
        """Poll until :attr:`halt`."""
        while not self.halt.is_set():
            self.poll_once()
            self.halt.wait(POLL)

    def final_states(self) -> None:
        """Record the state of every id still not ready (PENDING, RETRY, STARTED)."""
        with self.mutex:
            waiting = sorted(self.pending)
        for task_id in waiting:
            with contextlib.suppress(Exception):
                state = str(self.app.backend.get_task_meta(task_id).get("status", "PENDING"))
                with self.mutex:
                    self.outcomes[task_id] = Outcome(task_id, state)

    # -- the watcher -------------------------------------------------------------------------

    def watch_once(self) -> None:
        """Record the end of open bodies whose process is gone, as ``vanished``."""
        recorder = self.recorder
        for body in recorder.open_bodies():
            if body.pid in self.killed or alive(body.pid):
                continue
            record = {"id": body.id, "end": time.monotonic(), "how": "vanished", "trusted": None}
            recorder.client().rpush(recorder.key("ends"), json.dumps(record))

    def watcher(self) -> None:
        """Watch until :attr:`halt` (every 0.2 s)."""
        while not self.halt.is_set():
            with contextlib.suppress(Exception):
                self.watch_once()
            self.halt.wait(0.2)

    def start(self) -> list[threading.Thread]:
        """Start the poller and the watcher (daemon threads; stop with :attr:`halt`)."""
        threads = [
            threading.Thread(target=self.poller, name="invariants-poller", daemon=True),
            threading.Thread(target=self.watcher, name="invariants-watcher", daemon=True),
        ]
        for thread in threads:
            thread.start()
        return threads

    def close(self) -> None:
        """Stop the threads and stop capturing publishes."""
        self.halt.set()
        signals.before_task_publish.disconnect(dispatch_uid=f"invariants.duplicate.{id(self)}")
