"""The invariants of the modes, as pure functions over one run's records.

:func:`check` gives every call its terminal state (:data:`~tests.invariants.modes.TERMINALS`)
and lists every :class:`Violation`. The invariants, for every call the driver made:

1. **It ends in exactly one terminal, reported state.** ``apply_async`` raised
   (*refused*), or its ``AsyncResult`` id reached a ready state within the bounded wait:
   *ran* / *failed* (a body of that id ran with the expected arguments and its result is
   the body's), *skipped* (SUCCESS with no body, and a skip record from ``skip_info``),
   *raised* (FAILURE ``TaskLocked``), *superseded* (REVOKED, and ``lock_superseded``
   names a later call of the key), or it shares the id of another call: *deduplicated*
   (queue scope: the id of the call queued before it), *coalesced* / *debounced* (the
   follow-up's or the burst's id). The mode lists which of these it allows; a state it
   does not allow (a coalesced follow-up that failed ``TaskThrottled``, a burst skipped) is
   ``not_allowed``; an id still PENDING, RETRY or STARTED at the end is ``lost``.
2. **It ran with the right arguments.** An id shared by several calls runs the latest of
   them under coalesce, replace and debounce, the call that published it otherwise
   (``wrong_arguments``); a result that no body of that id returned is ``unexpected_result``.
3. **Never run after being superseded** (``ran_after_superseded``; a run superseded while
   it held its key to run may begin its body up to :data:`STOP_GRACE` s after); under
   ``lock_replace_running`` a superseded run that was running must be stopped
   (``superseded_not_stopped``: it completed more than :data:`STOP_GRACE` s after the call
   that replaced it). REVOKED without a ``lock_superseded`` naming a later call of the key
   is ``superseded_unreported``. *result_lost* (FAILURE ``ResultLost``) must follow a
   completed body of the id whose process was killed after it ended
   (``result_lost_unfounded``: the result was not lost, a copy gave up on it too soon).
4. **Never more than N at once** (``lock_limit``, 1 by default): body intervals of one key
   (start to recorded end, to the kill of its process, to the SIGTERM that stopped it, or,
   when its lease was lost, to the last moment it saw the lease valid) never overlap beyond
   N (``overlap``); under ``lock_release="success"`` a successful run keeps its slot
   ``lock_hold`` seconds past its end (``hold_not_kept``, with :data:`HOLD_TOLERANCE`). A
   task id of a queue-scope (or debounced) mode completes its body at most once
   (``ran_twice``).
5. **A debounce runs the burst's last arguments in time**: at most ``lock_debounce`` after
   the burst's last call, and at most ``lock_debounce_max_wait`` after its first when set
   (``debounce_late``), plus a slack for busy workers (see :func:`debounce_slack`).
6. **A throttle admits at most N starts per window** of ``lock_rate_limit="N/T"``, across
   all workers (``rate_exceeded``; body starts, counted in windows of T minus
   :data:`RATE_TOLERANCE`), and a throttled ``retry`` comes back at the next free start
   (``throttle_paced_wrong``: sooner, or later than the start plus its spread and the
   slack of :func:`debounce_slack`).
7. **Lifetimes**: under ``lock_release="start"`` a duplicate is deduplicated only into a
   message that has not started (``dedup_into_started``); under ``lock_release="success"``
   a duplicate is deduplicated into a successful run only within its hold, and never into
   a failed run once it ended (``held_too_long``).
8. **Stacked limits hold** (``lock_limits``, ``lock_weight``): for every limit name a
   call's arguments render (:func:`limit_shares`, as the package renders it: limits of
   every task share one name space), the total weight of the runs inside it (body
   intervals as for ``overlap``: a killed run is inside until its kill, one whose lease was
   lost until it last saw it valid, which is its start when it never saw it valid: judged
   as it enters, then out) never passes the limit's number when a run enters
   (``limit_exceeded``: the limit, its peak, the number allowed, the runs inside).
9. **No lease is lost** unless the run's faults could cost one (``lease_lost``: the
   runner's stalls are shorter than the lease; the soak pauses workers past it).
10. **A parked call holds no worker**: a call parked when a whole worker was killed (and
    not published again or started since) does not come back as the broker's redelivery
    of a countdown retry that worker kept (``parked_in_worker``; see :func:`_check_parked`).

A violation whose window contains a restart of the lock Redis (which loses every lock,
follow-up, burst, skip record, rate window and success hold) is flagged ``restart=True``
and counted apart: the docs list what a restart may break.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from celery_singleton_lock.stacking import render_limit
from tests.invariants.modes import MODES, Mode
from tests.invariants.recording import KILL_LANDS
from tests.invariants.records import (
    BodyRun,
    Call,
    Exec,
    FaultRecord,
    Observation,
    Outcome,
    Receipt,
)

__all__ = [
    "HOLD_TOLERANCE",
    "KINDS",
    "NOT_THE_LOCK",
    "RATE_TOLERANCE",
    "READY",
    "STOP_GRACE",
    "Verdict",
    "Violation",
    "check",
    "debounce_slack",
    "fault_allowance",
    "limit_shares",
    "saturated_seconds",
]

#: Result states that end a task id.
READY = ("SUCCESS", "FAILURE", "REVOKED")
#: The violation kinds, and what each means.
KINDS: Mapping[str, str] = {
    "lost": "never reached a terminal state within the bounded wait (PENDING/RETRY for ever)",
    "lost_in_transport": "lost, its last message (the call, a retry or a handed call) never "
    "received by a worker, published as a worker was killed, or gone from the broker with a "
    "worker killed after it was published, or taken back by the broker after its body was "
    "killed and gone with a worker killed after that (kombu's Redis transport pops a message "
    "before it records it as unacknowledged, celery/celery#7950: not the lock)",
    "not_allowed": "ended in a terminal state its mode does not allow",
    "wrong_arguments": "the id ran with other arguments than the call it should run",
    "unexpected_result": "the stored result is not what a body of that id returned",
    "skip_unreported": "ended SUCCESS without running, and skip_info knows no skip",
    "skipped_by_itself": "skipped, naming its own task id as the holder",
    "superseded_unreported": "REVOKED without a lock_superseded naming a later call",
    "ran_after_superseded": "a body of a superseded call started after it was superseded",
    "superseded_not_stopped": "a running run replaced under lock_replace_running ran on",
    "overlap": "more runs of one key at once than lock_limit allows",
    "limit_exceeded": "more weight inside a stacked limit (lock_limits) at once than its "
    "number allows",
    "hold_not_kept": "a run started within lock_hold after a successful run",
    "ran_twice": "the body of one task id completed twice (queue scope, debounce)",
    "debounce_late": "a burst ran later than its deadline plus the slack",
    "rate_exceeded": "more starts in one window than lock_rate_limit allows",
    "throttle_paced_wrong": "a throttled retry came back sooner or later than the next free "
    "start (plus spread and slack)",
    "dedup_into_started": "deduplicated into a message whose body had already started",
    "held_too_long": "deduplicated into a run whose hold had ended, or that failed",
    "lease_lost": "a body lost its lease although no fault lasted a lease",
    "out_of_order": "under lock_order='enqueue' a call started before one made before it "
    "(neither with a countdown or ETA, no fault of the lock Redis between)",
    "ran_twice_unrecorded": "completed twice, the first time while the lock Redis was "
    "unreachable or just as its process was killed (its end could not be recorded), with "
    "its worker killed before it acknowledged the message: the broker delivered it again "
    "(at-least-once delivery)",
    "parked_in_worker": "a parked call waited in a worker: after that whole worker was "
    "killed, it came back only as the broker's redelivery of a retry with a countdown that "
    "the worker had kept unacknowledged (so a visibility timeout, not its limit or window, "
    "decided when it ran)",
    "lost_behind_transport": "parked behind a queue-scope call whose message the broker "
    "transport lost as a worker was killed: that call holds the key for lock_queue_timeout "
    "(celery locks reap frees it)",
}
#: Violation kinds that are not the lock's doing, counted apart.
NOT_THE_LOCK = ("lost_in_transport", "ran_twice_unrecorded", "lost_behind_transport")
#: A process killed within this long (seconds) after its body ended may not have recorded
#: the run as finished: the worker writes that record a moment after the body returns.
RECORD_WINDOW = 0.25
#: Faults that kill a whole worker (its consumer too).
WORKER_KILLS = ("worker_kill", "parked_kill")
#: A whole worker killed this soon (seconds) after a call parked may have died before it
#: acknowledged the message that parked it: the broker's redelivery of that message is
#: at-least-once delivery, not a parked call kept in the worker.
PARK_ACK_WINDOW = 0.5
#: A successful run's hold may end this much early (seconds): the body records its end a
#: moment before the hold is taken, on the same host clock.
HOLD_TOLERANCE = 0.05
#: Rate windows are counted this much shorter (seconds): a start is recorded a few
#: milliseconds after the server admitted it, and those delays differ between starts.
RATE_TOLERANCE = 0.25
#: A duplicate may still be deduplicated into a run this long (seconds) past the end of
#: its hold (or the end of a failed run): the run records its end, then the worker takes
#: the hold (or releases) a moment later, and a loaded host stretches that moment.
DEDUP_TOLERANCE = 0.5
#: A run replaced under lock_replace_running may complete this long after the replacing
#: call returned (seconds): the revoke is a broadcast the worker acts on when it reads it.
STOP_GRACE = 2.0
#: Base slack of a debounced burst's deadline (seconds): ETA timers, the broker round trip,
#: the delivery script and a loaded two-CPU host.
DEBOUNCE_SLACK = 1.5
#: Idle moments of a worker shorter than this (seconds) count as busy: a pool process
#: that frees takes the next waiting message that fast.
BUSY_GAP = 0.3
#: A violation counts as under a restart when a restart of the lock Redis falls between
#: this long (s, plus the lease) before its window and this long after it.
RESTART_MARGIN = 1.0


@dataclass
class Violation:
    """One broken invariant."""

    kind: str
    mode: str
    key: str
    expected: str
    got: str
    calls: list[int] = field(default_factory=list)  # call numbers (n)
    task_ids: list[str] = field(default_factory=list)
    window: tuple[float, float] = (0.0, 0.0)
    restart: bool = False
    seed: int | None = None

    def line(self) -> str:
        """One line for a report."""
        where = f"seed {self.seed}, " if self.seed is not None else ""
        calls = ", ".join(str(n) for n in self.calls[:8])
        more = f" (+{len(self.calls) - 8})" if len(self.calls) > 8 else ""
        return (
            f"[{self.kind}{' / restart' if self.restart else ''}] {where}{self.mode} key "
            f"{self.key}, calls {calls}{more}: expected {self.expected}; got {self.got}"
        )


@dataclass
class Verdict:
    """The terminal state of every call, and every violation."""

    terminals: dict[int, str]
    violations: list[Violation]
    figures: dict[str, Any]

    @property
    def safe(self) -> list[Violation]:
        """Violations of the lock's promises, with no restart of the lock Redis in their
        window."""
        return [
            item for item in self.violations if not item.restart and item.kind not in NOT_THE_LOCK
        ]

    @property
    def transport(self) -> list[Violation]:
        """Calls lost by the broker transport (not the lock), outside a restart."""
        return [item for item in self.violations if not item.restart and item.kind in NOT_THE_LOCK]

    @property
    def under_restart(self) -> list[Violation]:
        """Violations with a restart in their window."""
        return [item for item in self.violations if item.restart]

    def to_json(self) -> dict[str, Any]:
        """A JSON-able form."""
        return {
            "terminals": {str(n): state for n, state in self.terminals.items()},
            "violations": [asdict(item) for item in self.violations],
            "figures": self.figures,
        }


# -- helpers ---------------------------------------------------------------------------------


def fault_allowance(fault: FaultRecord, lease: float, visibility: float) -> float:
    """How much later (seconds) a fault may make a run: a killed worker's messages come
    back one visibility timeout after it died; a killed pool process's message is requeued
    at once; a pause or stall lasts its length, and the lease when it cost one."""
    length = max(0.0, fault.t1 - fault.t0)
    allowances = {
        "worker_kill": length + visibility + 3.0,
        "parked_kill": length + visibility + 3.0,
        "child_kill": 3.0,
        "redis_stall": length + 2.0,
        "redis_stop": length + 2.0,
        "worker_stop": length + lease + 2.0,
        "net_stall": length + lease + 2.0,
        "net_cut": 3.0,
        "clock_skew": length + visibility + 3.0,
    }
    return allowances.get(fault.kind, length + 3.0)


def _merged(intervals: Iterable[tuple[float, float]], gap: float) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1] + gap:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def saturated_seconds(
    execs: Sequence[Exec], capacity: int, start: float, end: float, now: float
) -> float:
    """Seconds within [start, end] during which ``capacity`` or more of ``execs`` ran at
    once (idle moments shorter than :data:`BUSY_GAP` count as busy)."""
    if end <= start or capacity <= 0:
        return 0.0
    events: list[tuple[float, int]] = []
    for item in execs:
        events.append((item.start, 1))
        events.append((item.end if item.end is not None else now, -1))
    events.sort(key=lambda event: (event[0], event[1]))
    busy: list[tuple[float, float]] = []
    running, since = 0, 0.0
    for moment, delta in events:
        before = running
        running += delta
        if before < capacity <= running:
            since = moment
        elif running < capacity <= before:
            busy.append((since, moment))
    if running >= capacity:
        busy.append((since, now))
    total = 0.0
    for first, last in _merged(busy, BUSY_GAP):
        total += max(0.0, min(last, end) - max(first, start))
    return total


def debounce_slack(
    obs: Observation, task_id: str, due: float, started: float, since: float
) -> tuple[float, str]:
    """The slack a burst ``task_id`` due at ``due`` gets if it started at ``started``
    (its first call at ``since``): :data:`DEBOUNCE_SLACK`, plus the time the worker
    holding its message had every pool process busy between ``due`` and ``started`` (a
    busy worker delays delivery: the message waits in its prefetch), plus
    :func:`fault_allowance` for every fault between ``since`` and ``started``."""
    capacity = {worker.name: worker.concurrency for worker in obs.workers}
    holders = {receipt.worker for receipt in obs.receipts if receipt.task_id == task_id}
    busy = 0.0
    for worker in holders:
        ran_there = [item for item in obs.execs if item.worker == worker]
        seconds = saturated_seconds(ran_there, capacity.get(worker, 1), due, started, obs.ended)
        busy = max(busy, seconds)
    faults = [f for f in obs.faults if f.t0 <= started and f.t1 >= since - obs.lease]
    allowance = sum(fault_allowance(f, obs.lease, obs.visibility_timeout) for f in faults)
    why = f"{DEBOUNCE_SLACK:g} s base + {busy:.2f} s worker busy"
    if faults:
        why += f" + {allowance:.1f} s for {', '.join(sorted({f.kind for f in faults}))}"
    return DEBOUNCE_SLACK + busy + allowance, why


class _Run:
    """The records of one observation, indexed."""

    def __init__(self, obs: Observation, modes: Mapping[str, Mode]) -> None:
        self.obs = obs
        self.modes = modes
        self.calls = sorted(obs.calls, key=lambda call: call.i)
        self.by_result: dict[str, list[Call]] = defaultdict(list)
        for call in self.calls:
            if call.result_id is not None:
                self.by_result[call.result_id].append(call)
        self.by_own = {call.own_id: call for call in self.calls}
        self.by_n = {call.n: call for call in self.calls}
        self.bodies: dict[str, list[BodyRun]] = defaultdict(list)
        for body in obs.bodies:  # a start recorded just as its process was being killed
            kill = next((k for k in obs.kills if k.pid == body.pid
                         and k.t <= body.start <= k.t + KILL_LANDS), None)  # fmt: skip
            if body.end is None and kill is not None:
                body.end, body.how = body.start, "killed"
        for body in sorted(obs.bodies, key=lambda body: body.start):
            self.bodies[body.task_id].append(body)
        self.superseded: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for record in obs.signals:
            if record.signal == "lock_superseded" and record.task_id:
                self.superseded[record.task_id].append({"t": record.t, **record.fields})
        self.restarts = [f.t0 for f in obs.faults if f.kind == "redis_restart"]
        self.received: dict[str, list[float]] = defaultdict(list)
        for receipt in obs.receipts:
            self.received[receipt.task_id].append(receipt.t)
        self.published: dict[str, list[float]] = defaultdict(list)
        for record in sorted(obs.published, key=lambda record: record.t):
            self.published[record.task_id].append(record.t)
        self.violations: list[Violation] = []
        self.terminals: dict[int, str] = {}
        #: Calls (per result id) whose terminal state their mode does not allow.
        self.disallowed: dict[str, list[Call]] = defaultdict(list)
        #: Stacked limits: the highest weight seen inside each name, and its number.
        self.limit_peaks: dict[str, dict[str, int]] = {}

    def outcome(self, task_id: str) -> Outcome:
        return self.obs.outcomes.get(task_id) or Outcome(task_id, "PENDING")

    def restart_between(self, start: float, end: float) -> bool:
        low = start - self.obs.lease - RESTART_MARGIN
        return any(low <= moment <= end + RESTART_MARGIN for moment in self.restarts)

    def flag(
        self,
        kind: str,
        calls: Sequence[Call],
        expected: str,
        got: str,
        window: tuple[float, float],
        task_ids: Sequence[str] = (),
        *,
        mode: str | None = None,
        key: str | None = None,
    ) -> None:
        first = calls[0] if calls else None
        self.violations.append(
            Violation(
                kind, mode or (first.mode if first else "?"), key or (first.key if first else "?"),
                expected, got, sorted({call.n for call in calls}), list(task_ids),
                (round(window[0], 3), round(window[1], 3)),
                self.restart_between(*window), self.obs.seed,
            )
        )  # fmt: skip


def _describe(outcome: Outcome) -> str:
    if outcome.state == "SUCCESS":
        return f"SUCCESS {outcome.value!r}"
    if outcome.error:
        return f"{outcome.state} {outcome.error}: {outcome.error_text[:120]}"
    return outcome.state


# -- the terminal state of each call ---------------------------------------------------------


def _terminal(run: _Run, call: Call) -> None:
    """Classify ``call`` (and flag what its state breaks)."""
    mode = run.modes[call.mode]
    if call.result_id is None:
        state = "refused"
        run.terminals[call.n] = state
        if state not in mode.terminals:
            run.flag("not_allowed", [call], f"one of {sorted(mode.terminals)}",
                     f"apply_async raised {call.error}: {call.error_text[:120]}",
                     (call.t_call, call.t_return))  # fmt: skip
        return
    rid = call.result_id
    group = run.by_result[rid]
    outcome = run.outcome(rid)
    shared = rid != call.own_id or len(group) > 1
    if shared and mode.latest_wins:
        joined = "debounced" if mode.debounce is not None else "coalesced"
    elif shared:
        joined = "deduplicated" if rid != call.own_id else ""
    else:
        joined = ""
    if outcome.state == "REVOKED":
        state = "superseded"
    elif outcome.state == "SUCCESS" and outcome.value is None:
        state = "skipped"
    elif outcome.state == "SUCCESS":
        state = joined or "ran"
    elif outcome.state == "FAILURE" and outcome.error == "RuntimeError":
        state = joined or "failed"
    elif outcome.state == "FAILURE" and outcome.error == "TaskLocked":
        state = "raised"
    elif outcome.state == "FAILURE" and outcome.error == "ResultLost":
        state = "result_lost"
    elif outcome.state == "FAILURE":
        state = f"failed with {outcome.error}"
    else:
        state = "lost"
    run.terminals[call.n] = state
    if state not in mode.terminals and state != "lost":
        run.disallowed[rid].append(call)


def _near_a_worker_kill(run: _Run, sent: Sequence[float]) -> bool:
    """Whether a whole worker was killed just after a message was published (at one of
    ``sent``): kombu's Redis transport pops a message before it records it as
    unacknowledged, so a worker killed in between takes it with it (celery/celery#7950)."""
    return any(
        fault.kind in WORKER_KILLS and moment - 0.5 <= fault.t0 <= moment + 2.0
        for fault in run.obs.faults
        for moment in sent
    )


def _killed_after(run: _Run, moment: float) -> bool:
    """Whether a whole worker was killed after a message was published at ``moment`` (or
    just before: the kill is recorded as it is sent)."""
    return any(f.kind in WORKER_KILLS and f.t0 >= moment - 0.5 for f in run.obs.faults)


def _taken_back_and_lost(run: _Run, rid: str, bodies: Sequence[BodyRun]) -> float | None:
    """When the last delivery of ``rid`` had its body killed, no worker's consumer received
    the message after that body started, the message is in the broker neither queued nor
    unacknowledged at the end, and a whole worker was killed after the body's kill: that
    kill's moment, else None. The broker took the message back (a worker's main process
    requeues a run whose pool process died, ``reject_on_worker_lost``; a killed worker's
    unacknowledged messages are restored), and a consumer killed before it recorded the
    message took it off the queue (celery/celery#7950). The lock never saw it again: every
    delivery is received by a consumer before any lock code runs."""
    received = run.received.get(rid, [])
    kills = [(body.start, body.end) for body in bodies if body.how == "killed" and body.end]
    if not received or not kills:
        return None
    start, killed = kills[-1]
    left = run.obs.notes.get("broker_left")
    if (
        start < max(received)  # received again after that body started
        or left is None
        or rid in left
        or not any(f.kind in WORKER_KILLS and f.t0 > killed for f in run.obs.faults)
    ):
        return None
    return killed


def _expected_call(run: _Run, mode: Mode, rid: str) -> Call | None:
    """The call whose arguments id ``rid`` must run."""
    group = run.by_result[rid]
    if mode.latest_wins:
        return group[-1] if group else None
    return run.by_own.get(rid)


def _check_result(run: _Run, rid: str) -> None:
    """Invariants of one result id shared by the calls that returned it."""
    group = run.by_result[rid]
    mode = run.modes[group[0].mode]
    outcome = run.outcome(rid)
    window = (group[0].t_call, run.obs.ended)
    bodies = run.bodies.get(rid, [])
    if outcome.state not in READY:
        ran = ", ".join(f"n={b.n} {b.how or 'running'}" for b in bodies) or "no body"
        kind = "lost"
        sent = run.published.get(rid, [])
        if not sent:
            ran += ", never published"
        elif not any(t >= sent[-1] for t in run.received.get(rid, [])):
            # Its last message (the first, or a retry) never reached a worker's consumer.
            seen = "never received" if rid not in run.received else "not received again"
            ran += f", published {len(sent)}x (last at +{sent[-1] - group[0].t_call:.2f} s), " \
                f"{seen} by a worker"  # fmt: skip
            later = [b for b in bodies if b.start >= sent[-1]]
            left = run.obs.notes.get("broker_left")
            # Not in the broker at the end either (neither queued nor unacknowledged): a
            # consumer took it off the queue and never received it, which only a worker
            # killed in between does, however long the message had waited in the queue.
            gone = left is not None and rid not in left and _killed_after(run, sent[-1])
            if not later and (_near_a_worker_kill(run, sent[-1:]) or gone):
                kind = "lost_in_transport"
            if not later and gone:
                ran += "; not in the broker either, and a whole worker was killed after it"
        elif (killed := _taken_back_and_lost(run, rid, bodies)) is not None:
            kind = "lost_in_transport"
            ran += (
                f"; its delivery's body was killed at +{killed - group[0].t_call:.2f} s, no "
                "worker received it again, it is not in the broker, and a whole worker was "
                "killed after that"
            )
        where = run.obs.notes.get("broker_left", {}).get(rid)
        if where:
            ran += f"; its message is still {where} in the broker"
        mutex_ms = run.obs.notes.get("restore_mutex_ms", -2)
        if where == "unacknowledged" and mutex_ms > 0:
            ran += f" (kombu's restore mutex still held, {mutex_ms / 1000:.0f} s left)"
        run.flag(kind, group, "a terminal state within the bounded wait",
                 f"{outcome.state} at the end ({ran})", window, [rid])  # fmt: skip
        return
    wrong = run.disallowed.get(rid)
    if wrong:
        states = sorted({run.terminals[call.n] for call in wrong})
        run.flag("not_allowed", wrong, f"one of {sorted(mode.terminals)}",
                 f"{', '.join(states)} ({_describe(outcome)})",
                 (wrong[0].t_call, outcome.seen or run.obs.ended), [rid])  # fmt: skip
    expected = _expected_call(run, mode, rid)
    if outcome.state == "SUCCESS" and outcome.value is None:
        if outcome.skip_reason is None:
            run.flag(
                "skip_unreported",
                group,
                "a skip record (skip_info) for a run that ended without its body",
                "SUCCESS None, no skip record",
                window,
                [rid],
            )
        elif outcome.skip_holder == rid:
            run.flag(
                "skipped_by_itself",
                group,
                "skipped for another holder",
                f"skip_info names {rid} itself as the holder",
                window,
                [rid],
            )
        return  # fmt: skip
    if outcome.state in ("SUCCESS", "FAILURE") and outcome.error in (None, "RuntimeError"):
        done = [b for b in bodies if b.completed]
        if outcome.state == "SUCCESS" and not any(b.n == outcome.value for b in done):
            run.flag("unexpected_result", group, "the result a body of this id returned",
                     f"SUCCESS {outcome.value!r}, bodies: "
                     f"{[(b.n, b.how) for b in bodies]}", window, [rid])  # fmt: skip
        if expected is not None and done:
            ran_n = outcome.value if outcome.state == "SUCCESS" else done[-1].n
            if ran_n != expected.n:
                run.flag("wrong_arguments", group,
                         f"{rid} runs the arguments of call {expected.n}",
                         f"it ran call {ran_n}'s", window, [rid])  # fmt: skip
    if outcome.state == "FAILURE" and outcome.error == "ResultLost":
        _check_result_lost(run, rid, group, bodies, window)
    if outcome.state == "REVOKED":
        _check_superseded(run, mode, rid, group)


def _check_result_lost(
    run: _Run, rid: str, group: list[Call], bodies: list[BodyRun], window: tuple[float, float]
) -> None:
    """``ResultLost`` claims the body ran once and its process died before storing the
    result: a body of the id completed, and its process was killed after it ended."""
    ends = [(b.pid, b.end) for b in bodies if b.completed and b.end is not None]
    # A kill is recorded just before its signal: the body may record its end meanwhile.
    if not any(
        k.pid == pid and k.t >= end - KILL_LANDS for pid, end in ends for k in run.obs.kills
    ):
        got = ", ".join(f"n={b.n} {b.how or 'running'} pid {b.pid}" for b in bodies)
        run.flag("result_lost_unfounded", group,
                 "ResultLost only after a completed body whose process was then killed",
                 f"bodies: {got or 'none'}", window, [rid])  # fmt: skip


def _check_superseded(run: _Run, mode: Mode, rid: str, group: list[Call]) -> None:
    signals = run.superseded.get(rid, [])
    later = {
        call.own_id: call
        for call in run.calls
        if call.mode == group[0].mode and call.key == group[0].key and call.i > group[0].i
    }
    by = next((run.by_own.get(str(s.get("by"))) for s in signals if s.get("by") in later), None)
    window = (group[0].t_call, run.obs.ended)
    if by is None:
        got = f"lock_superseded: {signals}" if signals else "no lock_superseded signal"
        run.flag("superseded_unreported", group,
                 "REVOKED with lock_superseded naming a later call of the key", got, window,
                 [rid])  # fmt: skip
        return
    # A holder superseded while running (lock_replace_running) had taken its key for the
    # body already: that body may begin a moment after (it is terminated, and the new call
    # waits for its process to stop); a start later than STOP_GRACE is another delivery.
    running = any(s.get("running") for s in signals if s.get("by") == by.own_id)
    grace = STOP_GRACE if running else 0.0
    for body in run.bodies.get(rid, []):
        if body.start > by.t_return + grace:
            run.flag("ran_after_superseded", [*group, by],
                     f"{rid} never runs after call {by.n} superseded it",
                     f"its body (n={body.n}) started {body.start - by.t_return:.2f} s after",
                     (by.t_call, body.start), [rid, by.own_id])  # fmt: skip
        elif (
            mode.prefork_only
            and body.how in ("ok", "fail")
            and body.end is not None
            and body.end > by.t_return + STOP_GRACE
        ):
            run.flag("superseded_not_stopped", [*group, by],
                     f"the running {rid} is terminated when call {by.n} replaces it",
                     f"it ran on and completed {body.end - by.t_return:.2f} s later",
                     (by.t_call, body.end), [rid, by.own_id])  # fmt: skip


# -- invariants over bodies ------------------------------------------------------------------


def _occupancy(run: _Run, mode: Mode, body: BodyRun) -> tuple[float, float, float]:
    """(start, end of the body's hold, end of its slot) of one body."""
    until = body.until()
    end = until if until is not None else run.obs.ended
    slot = end
    if mode.hold is not None and body.how == "ok" and body.end is not None:
        slot = body.end + mode.hold - HOLD_TOLERANCE
    return body.start, end, slot


def _check_overlaps(run: _Run) -> None:
    per_key: dict[tuple[str, str], list[BodyRun]] = defaultdict(list)
    for body in run.obs.bodies:
        per_key[(body.mode, body.key)].append(body)
    for (mode_name, key), bodies in per_key.items():
        mode = run.modes[mode_name]
        if not mode.exclusive:
            continue
        spans = sorted((_occupancy(run, mode, body), body) for body in bodies)
        active: list[tuple[tuple[float, float, float], BodyRun]] = []
        for span, body in spans:
            start = span[0]
            active = [(other, b) for other, b in active if other[2] > start]
            if len(active) >= mode.limit:
                in_hold = all(other[1] <= start for other, _ in active)
                kind = "hold_not_kept" if in_hold else "overlap"
                names = ", ".join(
                    f"n={b.n} [{b.task_id[:8]} {b.start - start:+.2f}..{other[1] - start:+.2f}"
                    f"{' +hold' if other[2] > other[1] else ''} {b.how or 'running'}]"
                    for other, b in active
                )
                expected = (
                    f"at most {mode.limit} run(s) of the key at once"
                    if kind == "overlap"
                    else f"no start within {mode.hold:g} s after a successful run"
                )
                involved = [b for _, b in active] + [body]
                calls = [run.by_own[b.task_id] for b in involved if b.task_id in run.by_own]
                earliest = min(b.start for b in involved)
                run.flag(kind, calls, expected,
                         f"n={body.n} ({body.task_id[:8]}) started while {names} held it",
                         (earliest, start), [b.task_id for b in involved], mode=mode_name,
                         key=key)  # fmt: skip
            active.append((span, body))


def limit_shares(mode: Mode, bound: Mapping[str, Any]) -> tuple[int, dict[str, int]]:
    """(weight, {limit name: number}) of a run of ``mode`` with the ``bound`` arguments,
    as the package takes them: each template rendered by the package's own
    :func:`~celery_singleton_lock.stacking.render_limit`, two templates rendering one name
    counting its smaller number, a callable weight called with the arguments as keywords.
    ``(1, {})`` for a mode without stacked limits."""
    numbers: dict[str, int] = {}
    for template, number in mode.limits:
        name = render_limit(template, bound)
        numbers[name] = min(number, numbers.get(name, number))
    if not numbers:
        return 1, numbers
    weight = mode.weight(**bound) if callable(mode.weight) else mode.weight
    return int(weight), numbers


def _bound(run: _Run, body: BodyRun) -> dict[str, Any]:
    """The arguments a body ran with, bound to the modes' signature ``(key, n, seconds,
    fail=False)``: the body's key and n, and the seconds and fail of the call of that n."""
    call = run.by_n.get(body.n)
    seconds, fail = (call.seconds, call.fail) if call is not None else (0.0, False)
    return {"key": body.key, "n": body.n, "seconds": seconds, "fail": fail}


def _check_limits(run: _Run) -> None:
    """Per limit name, sweep the body intervals of every run with a share in it (ends before
    starts at one moment, as the overlap check counts them): a run that enters while the
    weight inside plus its own passes its number opens an episode, which lasts until the
    weight inside is back within that number, and is flagged once with every run inside
    during it and the peak weight. A run with no extent (its lease lost before it first
    saw it valid) is judged as it enters and leaves at once, as ``overlap`` judges it."""
    per_name: dict[str, list[tuple[float, int, int, int, BodyRun]]] = defaultdict(list)
    at_once: set[str] = set()
    for body in run.obs.bodies:
        mode = run.modes[body.mode]
        if not mode.limits:
            continue
        weight, numbers = limit_shares(mode, _bound(run, body))
        start, end, _ = _occupancy(run, mode, body)
        if end <= start:
            at_once.add(body.id)  # its end would sort before its own start
        for name, number in numbers.items():
            per_name[name].append((start, 1, weight, number, body))
            if end > start:
                per_name[name].append((end, 0, weight, number, body))
    for name, events in per_name.items():
        events.sort(key=lambda event: (event[0], event[1]))
        _sweep_limit(run, name, events, at_once)


def _sweep_limit(
    run: _Run, name: str, events: list[tuple[float, int, int, int, BodyRun]], at_once: set[str]
) -> None:
    """Sweep the sorted (moment, starts, weight, number, body) events of limit ``name``
    (see :func:`_check_limits`); a run in ``at_once`` leaves right after it enters."""
    inside: dict[str, tuple[int, BodyRun]] = {}
    episode: dict[str, Any] | None = None
    seen = run.limit_peaks.setdefault(name, {"peak": 0, "number": events[0][3]})

    def leave(body: BodyRun, moment: float) -> None:
        nonlocal episode
        inside.pop(body.id, None)
        total = sum(w for w, _ in inside.values())
        if episode is not None and total <= episode["allowed"]:
            _flag_limit(run, name, episode, moment)
            episode = None

    for moment, starts, weight, number, body in events:
        if not starts:
            leave(body, moment)
            continue
        inside[body.id] = (weight, body)
        total = sum(w for w, _ in inside.values())
        seen["peak"], seen["number"] = max(seen["peak"], total), min(seen["number"], number)
        if episode is None and total > number:
            episode = {"allowed": number, "peak": total, "first": body, "start": moment,
                       "runs": dict(inside)}  # fmt: skip
        elif episode is not None:
            episode["peak"] = max(episode["peak"], total)
            episode["runs"][body.id] = (weight, body)
        if body.id in at_once:
            leave(body, moment)
    if episode is not None:
        _flag_limit(run, name, episode, run.obs.ended)


def _flag_limit(run: _Run, name: str, episode: dict[str, Any], until: float) -> None:
    runs: list[tuple[int, BodyRun]] = sorted(episode["runs"].values(), key=lambda r: r[1].start)
    start, first = episode["start"], episode["first"]
    names = ", ".join(
        f"n={b.n} w{w} {b.mode} {b.key} [{b.task_id[:8]} {b.start - start:+.2f}.."
        f"{(b.until() if b.until() is not None else run.obs.ended) - start:+.2f} "
        f"{b.how or 'running'}]"
        for w, b in runs
    )
    calls = [run.by_own[b.task_id] for _, b in runs if b.task_id in run.by_own]
    earliest = min(b.start for _, b in runs)
    run.flag("limit_exceeded", calls,
             f"at most weight {episode['allowed']} inside limit {name!r} at once",
             f"peak weight {episode['peak']} (allowed {episode['allowed']}) from n={first.n} "
             f"({first.task_id[:8]}) entering, for {until - start:.2f} s: {names}",
             (earliest, until), [b.task_id for _, b in runs], mode=first.mode,
             key=name)  # fmt: skip


def _check_once(run: _Run) -> None:
    per_id: dict[str, list[BodyRun]] = defaultdict(list)
    for body in run.obs.bodies:
        if run.modes[body.mode].once_per_id and body.completed:
            per_id[body.task_id].append(body)
    stalls = [f for f in run.obs.faults if f.kind in ("redis_stall", "redis_restart")]
    for task_id, bodies in per_id.items():
        if len(bodies) > 1:
            calls = run.by_result.get(task_id) or (
                [run.by_own[task_id]] if task_id in run.by_own else []
            )
            first, end = bodies[0], bodies[0].end
            unrecorded = end is not None and (
                (
                    any(f.t0 <= end <= f.t1 for f in stalls)
                    and any(k.pid == first.pid and k.t >= end for k in run.obs.kills)
                )
                or any(
                    k.pid == first.pid and end - KILL_LANDS <= k.t <= end + RECORD_WINDOW
                    for k in run.obs.kills
                )
            )
            kind = "ran_twice_unrecorded" if unrecorded else "ran_twice"
            run.flag(kind, calls, f"the body of {task_id} completes once",
                     f"it completed {len(bodies)} times (n={[b.n for b in bodies]})",
                     (bodies[0].start, bodies[-1].end or run.obs.ended), [task_id],
                     mode=bodies[0].mode, key=bodies[0].key)  # fmt: skip


def _check_rates(run: _Run) -> None:
    per_key: dict[tuple[str, str], list[BodyRun]] = defaultdict(list)
    for body in run.obs.bodies:
        if run.modes[body.mode].rate is not None:
            per_key[(body.mode, body.key)].append(body)
    for (mode_name, key), bodies in per_key.items():
        rate = run.modes[mode_name].rate
        assert rate is not None
        starts, window = sorted(bodies, key=lambda body: body.start), rate[1] - RATE_TOLERANCE
        index = 0
        while index < len(starts):
            first = starts[index]
            inside = [b for b in starts[index:] if b.start < first.start + window]
            if len(inside) > rate[0]:
                calls = [run.by_own[b.task_id] for b in inside if b.task_id in run.by_own]
                run.flag("rate_exceeded", calls,
                         f"at most {rate[0]} starts per {rate[1]:g} s",
                         f"{len(inside)} starts within {inside[-1].start - first.start:.3f} s "
                         f"(n={[b.n for b in inside]})",
                         (first.start, inside[-1].start), [b.task_id for b in inside],
                         mode=mode_name, key=key)  # fmt: skip
                index += len(inside)
            else:
                index += 1


def _check_debounce(run: _Run) -> None:
    for rid, group in run.by_result.items():
        mode = run.modes[group[0].mode]
        if mode.debounce is None:
            continue
        last = group[-1]
        ran = [b for b in run.bodies.get(rid, []) if b.n == last.n]
        if not ran:
            continue  # lost or wrong arguments: flagged by _check_result
        started = ran[0].start
        first = group[0]
        due = last.t_return + mode.debounce
        if mode.max_wait is not None:
            due = min(due, first.t_call + mode.max_wait)
        slack, why = debounce_slack(run.obs, rid, due, started, first.t_call)
        if started > due + slack:
            bound = (
                f"lock_debounce_max_wait={mode.max_wait:g} s after its first call"
                if mode.max_wait is not None and due == first.t_call + mode.max_wait
                else f"lock_debounce={mode.debounce:g} s after its last call"
            )
            run.flag("debounce_late", group,
                     f"burst {rid[:8]} runs within {bound} + slack ({why})",
                     f"it ran {started - due:.2f} s after that deadline "
                     f"({len(group)} calls, first at +0, last at "
                     f"+{last.t_call - first.t_call:.2f} s)",
                     (first.t_call, started), [rid])  # fmt: skip


def _check_throttle_pacing(run: _Run) -> None:
    """A throttled run under ``retry`` comes back at the next free start the throttle
    named (``retry_in``), plus its spread (at most 10 %, at most 1 s), plus the slack of
    :func:`debounce_slack` (a busy worker, faults) - not sooner, and not paced by the
    busy-key backoff. The attempt that comes back is the execution of the same task id
    with one more retry; calls published twice are not judged (their copies' attempts
    cannot be told apart)."""
    for record in run.obs.signals:
        if record.signal != "lock_throttled" or record.fields.get("policy") != "retry":
            continue
        task_id, retry_in = record.task_id, record.fields.get("retry_in")
        if task_id is None or not isinstance(retry_in, (int, float)):
            continue
        execs = [e for e in run.obs.execs if e.task_id == task_id]
        throttled = next(
            (e for e in execs if e.pid == record.pid and e.start <= record.t
             and (e.end is None or e.end >= record.t)),
            None,
        )  # fmt: skip
        if throttled is None:
            continue
        again = [e.start for e in execs
                 if e.retries == throttled.retries + 1 and e.start > record.t]  # fmt: skip
        if not again:
            continue
        came, due = min(again), record.t + float(retry_in)
        spread = min(0.1 * float(retry_in), 1.0)
        slack, why = debounce_slack(run.obs, task_id, due + spread, came, record.t)
        calls = run.by_result.get(task_id) or (
            [run.by_own[task_id]] if task_id in run.by_own else []
        )
        if not calls or any(call.duplicate for call in calls):
            continue  # two copies of the message retry side by side: attempts do not pair
        if came < due - RATE_TOLERANCE or came > due + spread + slack:
            run.flag("throttle_paced_wrong", calls,
                     f"the throttled attempt comes back {float(retry_in):.2f} s later (the "
                     f"next free start), + {spread:.2f} s spread + slack ({why})",
                     f"it came back {came - record.t:.2f} s later",
                     (record.t, came), [task_id])  # fmt: skip


def _check_lifetimes(run: _Run) -> None:
    """Calls deduplicated into a run that had started (``lock_release="start"``), or into
    a run whose hold was over or that failed (``lock_release="success"``), flagged once per
    result id."""
    found: dict[tuple[str, str], list[tuple[Call, str, tuple[float, float]]]] = defaultdict(list)
    for call in run.calls:
        rid = call.result_id
        if rid is None or rid == call.own_id:
            continue
        mode = run.modes[call.mode]
        bodies = run.bodies.get(rid, [])
        if mode.options.get("lock_release") == "start":
            early = [b for b in bodies if b.start < call.t_call]
            if early:
                got = f"its body had started {call.t_call - early[0].start:.2f} s before"
                found[("dedup_into_started", rid)].append(
                    (call, got, (early[0].start, call.t_return))
                )
        if mode.hold is not None and mode.scope == "queue":
            for body in bodies:
                if body.end is None or body.how not in ("ok", "fail"):
                    continue
                limit = body.end + (mode.hold if body.how == "ok" else 0.0) + DEDUP_TOLERANCE
                if call.t_call > limit:
                    what = "hold had ended" if body.how == "ok" else "run had failed"
                    got = f"its {what} {call.t_call - limit:.2f} s before"
                    found[("held_too_long", rid)].append((call, got, (body.end, call.t_return)))
                    break
    for (kind, rid), items in found.items():
        calls = [call for call, _, _ in items]
        mode = run.modes[calls[0].mode]
        window = (min(w[0] for _, _, w in items), max(w[1] for _, _, w in items))
        if kind == "dedup_into_started":
            expected = "deduplicated only into a message still queued at the call"
        else:
            expected = (
                f"a duplicate gets the successful run's AsyncResult only within its "
                f"{mode.hold:g} s hold, and a failed run frees the key at once"
            )
        detail = "; ".join(f"call {call.n}: {got}" for call, got, _ in items[:4])
        run.flag(kind, calls, expected, f"deduplicated into {rid[:8]} ({detail})", window, [rid])


def _check_leases(run: _Run) -> None:
    if run.obs.leases_may_be_lost:
        return
    for body in run.obs.bodies:
        if body.how == "lease_lost":
            calls = [run.by_own[body.task_id]] if body.task_id in run.by_own else []
            run.flag("lease_lost", calls, "no lease lost (no fault lasts a lease)",
                     f"n={body.n} ({body.task_id[:8]}) saw its lease lost "
                     f"{(body.end or 0) - body.start:.2f} s into its run",
                     (body.start, body.end or run.obs.ended), [body.task_id],
                     mode=body.mode, key=body.key)  # fmt: skip


def _behind_transport(run: _Run) -> None:
    """A call lost while PARKED behind an earlier call of its key whose message the
    transport lost (which holds the key for lock_queue_timeout) is that loss's doing."""
    lost = [v for v in run.violations if v.kind == "lost_in_transport"]
    for item in run.violations:
        if item.kind != "lost" or "PARKED" not in item.got:
            continue
        cause = next((v for v in lost if (v.mode, v.key) == (item.mode, item.key)
                      and v.window[0] <= item.window[0]), None)  # fmt: skip
        if cause is not None:
            item.kind = "lost_behind_transport"
            item.got += f"; parked behind call(s) {cause.calls}, lost in transport"


def _check_parked(run: _Run) -> None:
    """A parked call holds no worker: for a call parked (``lock_parked``) when a whole
    worker was killed, neither published again (but as a retry with a countdown: an ETA
    message waits in the worker that takes it) nor started since, its first message
    received after the kill must not be the broker's redelivery of such a lock retry with a
    countdown. A kill within ``PARK_ACK_WINDOW`` of the park is excused (the message that
    parked it may not have been acknowledged yet)."""
    parked: dict[str, list[float]] = defaultdict(list)
    for record in run.obs.signals:
        if record.signal == "lock_parked" and record.task_id:
            parked[record.task_id].append(record.t)
    fresh: dict[str, list[float]] = defaultdict(list)
    for sent in run.obs.published:
        if not sent.eta:
            fresh[sent.task_id].append(sent.t)
    received: dict[str, list[Receipt]] = defaultdict(list)
    for receipt in sorted(run.obs.receipts, key=lambda item: item.t):
        received[receipt.task_id].append(receipt)
    kills = [f for f in run.obs.faults if f.kind in WORKER_KILLS]
    for task_id, moments in parked.items():
        own = run.by_own.get(task_id)
        calls = run.by_result.get(task_id) or ([own] if own is not None else [])
        if not calls:
            continue
        starts = [body.start for body in run.bodies.get(task_id, [])]
        for kill in kills:
            before = [moment for moment in moments if moment <= kill.t0]
            if not before:
                continue
            since = max(before)
            if kill.t0 - since < PARK_ACK_WINDOW:
                continue
            if any(since < t <= kill.t0 for t in fresh[task_id] + starts):
                continue  # published again (handed its key, its limits had room) or ran
            after = next((r for r in received[task_id] if r.t > kill.t0), None)
            if after is None or not (after.redelivered and after.eta and after.lock_retries):
                continue
            run.flag("parked_in_worker", calls,
                     "a parked call comes back from the lock Redis, whatever worker dies",
                     f"parked at +{since - calls[0].t_call:.2f} s, its worker killed "
                     f"{kill.t0 - since:.2f} s later; it came back {after.t - kill.t0:.2f} s "
                     "after the kill as the broker's redelivery of a countdown retry",
                     (since, after.t), [task_id])  # fmt: skip
            break


def _check_order(run: _Run) -> None:
    """Ordered modes: a call whose apply_async returned before another's began starts
    first (first starts compared). Calls with a countdown or ETA step aside; a stall or
    restart of the lock Redis between them excuses the pair (a call that could not take
    its turn at publish takes one at delivery)."""
    redis_faults = [f for f in run.obs.faults if f.kind in ("redis_stall", "redis_restart")]
    per_key: dict[tuple[str, str], list[tuple[Call, float]]] = defaultdict(list)
    for call in run.calls:
        bodies = run.bodies.get(call.own_id, [])
        if (run.modes[call.mode].ordered and bodies and call.countdown is None
                and call.eta is None and call.result_id == call.own_id):  # fmt: skip
            per_key[(call.mode, call.key)].append((call, bodies[0].start))
    for (mode_name, key), started in per_key.items():
        for before, before_start in started:
            for after, after_start in started:
                if before.t_return >= after.t_call or after_start >= before_start:
                    continue
                low, high = before.t_call - 1.0, max(after.t_return, before_start) + 1.0
                if any(f.t0 <= high and f.t1 >= low for f in redis_faults):
                    continue
                run.flag("out_of_order", [before, after],
                         f"call {before.n} (made first) starts first",
                         f"call {after.n} started {before_start - after_start:.3f} s before it",
                         (before.t_call, before_start), [before.own_id, after.own_id],
                         mode=mode_name, key=key)  # fmt: skip


# -- the verdict -----------------------------------------------------------------------------


def check(obs: Observation, modes: Mapping[str, Mode] = MODES) -> Verdict:
    """Judge one run."""
    run = _Run(obs, modes)
    for call in run.calls:
        _terminal(run, call)
    for rid in run.by_result:
        _check_result(run, rid)
    _check_overlaps(run)
    _check_limits(run)
    _check_once(run)
    _check_rates(run)
    _check_debounce(run)
    _check_throttle_pacing(run)
    _check_lifetimes(run)
    _check_leases(run)
    _check_order(run)
    _check_parked(run)
    _behind_transport(run)
    return Verdict(run.terminals, run.violations, _figures(run))


def _figures(run: _Run) -> dict[str, Any]:
    def group(item: Violation) -> str:
        if item.restart:
            return "after_restart"
        return "transport" if item.kind in NOT_THE_LOCK else "violations"

    per_mode: dict[str, dict[str, Any]] = {}

    def row_of(mode: str) -> dict[str, Any]:
        empty = {"calls": 0, "terminals": Counter(), "violations": 0, "transport": 0,
                 "after_restart": 0}  # fmt: skip
        return per_mode.setdefault(mode, empty)

    for call in run.calls:
        row = row_of(call.mode)
        row["calls"] += 1
        row["terminals"][run.terminals.get(call.n, "?")] += 1
    for item in run.violations:
        row_of(item.mode)[group(item)] += 1
    faults = Counter(f.kind for f in run.obs.faults)
    duplicates = sum(1 for call in run.calls if call.duplicate)
    if duplicates:
        faults["duplicate_publish"] += duplicates
    by_group: dict[str, Counter[str]] = defaultdict(Counter)
    for item in run.violations:
        by_group[group(item)][item.kind] += 1
    return {
        "calls": len(run.calls),
        "bodies": len(run.obs.bodies),
        "faults": dict(sorted(faults.items())),
        "terminals": dict(sorted(Counter(run.terminals.values()).items())),
        "violations": dict(sorted(by_group["violations"].items())),
        "lost_in_transport": sum(by_group["transport"].values()),
        "violations_after_restart": dict(sorted(by_group["after_restart"].items())),
        "limits": dict(sorted(run.limit_peaks.items())),
        "modes": {
            name: {**row, "terminals": dict(sorted(row["terminals"].items()))}
            for name, row in sorted(per_mode.items())
        },
    }
