"""What a soak's records say: overlaps, fencing order, lost and duplicated tasks, recovery.

Pure functions over the ledger's :class:`~benchmarks.soak.ledger.Snapshot` and the fault
log, so each judgement can be tested on hand-made records (``tests/unit/test_soak_analysis.py``).

The definitions:

- A body's **window** is ``[enter, last]``: from its accepted enter to its last accepted
  write. Every write is made only after ``current_lock().lease_lost`` answered False at
  that moment, so the lock promised exclusivity over the whole window. Two windows of one
  key that intersect are an **overlap**. It is counted *during data loss* when a restart
  of the lock Redis lies between the two holds (the lock itself was gone), otherwise it
  breaks the lock's promise.
- **Fencing order**: in the order bodies of one key entered, their fencing tokens must
  strictly increase — except that a queue-scope task whose body stopped (lease lost) and
  retried takes its own hold over, token included: equal tokens of one task id are a
  *continued hold* (nobody can have held the key in between), counted apart.
- A **stale write** is a write refused because a higher token had written to that key's
  resource: the fencing check doing its job (a holder that stalled past its lease).
- A **lost update** is a commit whose read-increment-write found another value than the
  one its body read at enter.
- A **lost task** was published and never completed: no body committed it and no run
  skipped it by its conflict policy. It is lost *in the broker transport* when no worker
  ever received it (kombu's Redis transport pops a message before it records it as
  unacknowledged: a worker killed in between takes the message with it, celery/celery#7950),
  otherwise it was lost *after a worker received it*, which ``acks_late`` and the lock
  must prevent. A **duplicate** was committed more than once (at least once delivery: a
  run killed after its commit, before its acknowledgement).
- An **unreported loss**: a body still running when another body of its key entered, yet
  it neither saw its lease lost (or its write refused, or its hold missing) nor got the
  ``lock_lost`` signal.
- **Recovery** after a crash: from the fault to the next body of each key the victim held.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmarks.soak.code import other_code
from benchmarks.soak.ledger import Body, Snapshot

__all__ = [
    "CRASHES",
    "PAUSES",
    "Fault",
    "Overlap",
    "Results",
    "analyse",
    "code_figures",
    "fencing_violations",
    "lost_and_duplicates",
    "overlaps",
    "recoveries",
    "unreported_losses",
]

#: Faults after which a key's recovery is measured: the holder crashed or froze.
CRASHES = ("child_kill", "worker_kill", "worker_stop", "net_stall")
#: Faults that freeze a holder's process past its lease: each victim still alive after it
#: must learn that it lost the lease (its body sees ``lease_lost``, or its release finds
#: the lock gone and ``lock_lost`` is sent). A stalled connection is different: the process
#: runs on, and a body that finished its work within the lease has nothing to learn.
PAUSES = ("worker_stop",)
#: A restart counts against a pair of holds when it falls after this long before the
#: first one entered (its acquire came a moment before its enter).
_RESTART_SLACK = 1.0


@dataclass
class Fault:
    """One injected fault, as the driver logged it (times: monotonic seconds)."""

    kind: str
    at: float
    ended: float
    target: str
    detail: str = ""
    #: (body id, key, task kind) of the bodies the target held when the fault began.
    held: list[tuple[str, str, str]] = field(default_factory=list)
    #: The processes it killed (SIGKILL), recorded just before.
    pids: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Overlap:
    """Two holds of one key whose windows intersect."""

    key: str
    first: str
    second: str
    seconds: float
    data_loss: bool


def _windows(bodies: Iterable[Body]) -> dict[str, list[Body]]:
    """Bodies with an accepted enter, per key, in the order they entered."""
    per_key: dict[str, list[Body]] = defaultdict(list)
    for body in bodies:
        if body.enter is not None:
            per_key[body.key].append(body)
    for entered in per_key.values():
        entered.sort(key=lambda body: body.enter or 0.0)
    return per_key


def _restart_between(restarts: Sequence[float], start: float, end: float) -> bool:
    return any(start - _RESTART_SLACK < moment <= end for moment in restarts)


def overlaps(bodies: Iterable[Body], restarts: Sequence[float]) -> list[Overlap]:
    """Every pair of windows of one key that intersect (each later body is compared with
    the earlier body whose window reaches the furthest)."""
    found: list[Overlap] = []
    for key, entered in _windows(bodies).items():
        reaching: Body | None = None
        for body in entered:
            enter = body.enter or 0.0
            if reaching is not None and enter < (reaching.last or 0.0):
                found.append(
                    Overlap(
                        key, reaching.id, body.id, (reaching.last or 0.0) - enter,
                        _restart_between(restarts, reaching.enter or 0.0, enter),
                    )
                )  # fmt: skip
            if reaching is None or (body.last or 0.0) > (reaching.last or 0.0):
                reaching = body
    return found


def fencing_order(bodies: Iterable[Body]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(violations, continued holds): (earlier, later) body ids of one key where the later
    one entered with a token that is not above every token that entered before it. Equal
    tokens of one task id are not a violation: a queue-scope task's retry takes its own
    hold over, fencing token included, and nobody can have held the key in between (the
    hold was still its own); they are listed as continued holds."""
    violations: list[tuple[str, str]] = []
    continued: list[tuple[str, str]] = []
    for entered in _windows(bodies).values():
        highest: Body | None = None
        for body in entered:
            if highest is not None and body.token <= highest.token:
                same_hold = body.token == highest.token and body.task_id == highest.task_id
                (continued if same_hold else violations).append((highest.id, body.id))
            if highest is None or body.token > highest.token:
                highest = body
    return violations, continued


def fencing_violations(bodies: Iterable[Body]) -> list[tuple[str, str]]:
    """The violations of :func:`fencing_order`."""
    return fencing_order(bodies)[0]


def lost_and_duplicates(snapshot: Snapshot) -> tuple[list[str], list[str]]:
    """(lost task ids, task ids committed more than once)."""
    lost = [
        task_id
        for task_id in snapshot.sent
        if not snapshot.commits.get(task_id) and not snapshot.skips.get(task_id)
    ]
    duplicates = [task_id for task_id, count in snapshot.commits.items() if count > 1]
    return sorted(lost), sorted(duplicates)


def _reported(body: Body, signals: set[tuple[str, int | None]]) -> bool:
    """Whether ``body``'s run learned that its hold was lost."""
    return body.outcome != "committed" or (body.task_id, body.token) in signals


def unreported_losses(snapshot: Snapshot) -> list[tuple[str, str]]:
    """(body, rival) pairs where ``rival`` entered while ``body`` still ran, and ``body``'s
    run never learned that it had lost the lock."""
    signals = {(item["task_id"], item.get("token")) for item in snapshot.lost_signals}
    found: list[tuple[str, str]] = []
    for entered in _windows(snapshot.bodies).values():
        for index, body in enumerate(entered):
            if body.exit is None or _reported(body, signals):
                continue
            rival = next(
                (
                    other
                    for other in entered[index + 1 :]
                    if (other.enter or 0.0) < (body.exit or 0.0)
                ),
                None,
            )
            if rival is not None:
                found.append((body.id, rival.id))
    return found


def recoveries(bodies: Iterable[Body], faults: Iterable[Fault]) -> list[dict[str, Any]]:
    """For every crash-like fault and key its target held: seconds from the fault to the
    next body of that key (None if none came)."""
    per_key = _windows(bodies)
    rows: list[dict[str, Any]] = []
    for fault in faults:
        if fault.kind not in CRASHES:
            continue
        for body_id, key, kind in fault.held:
            following = [b for b in per_key.get(key, []) if (b.enter or 0.0) > fault.at]
            seconds = (following[0].enter or 0.0) - fault.at if following else None
            rows.append(
                {"fault": fault.kind, "at": fault.at, "key": key, "kind": kind,
                 "victim": body_id, "seconds": seconds}
            )  # fmt: skip
    return rows


def paused_holders(snapshot: Snapshot, faults: Iterable[Fault]) -> tuple[int, list[str]]:
    """(holders frozen past their lease by a pause, those that never learned it)."""
    signals = {(item["task_id"], item.get("token")) for item in snapshot.lost_signals}
    by_id = {body.id: body for body in snapshot.bodies}
    frozen, silent = 0, []
    for fault in faults:
        if fault.kind not in PAUSES:
            continue
        for body_id, _, _ in fault.held:
            body = by_id.get(body_id)
            if body is None or body.exit is None or body.exit <= fault.at:
                continue  # it ended before the pause, or was killed later
            frozen += 1
            if not _reported(body, signals):
                silent.append(body_id)
    return frozen, silent


@dataclass
class Results:
    """Every figure of a soak; ``targets`` says which were met."""

    figures: dict[str, Any]
    targets: list[dict[str, Any]]
    recoveries: list[dict[str, Any]]
    examples: dict[str, list[Any]]

    @property
    def safe(self) -> bool:
        """Whether every safety target was met."""
        return all(row["met"] for row in self.targets if row["safety"])


def _summary(values: Sequence[float]) -> dict[str, float | int | None]:
    if not values:
        return {"count": 0, "median": None, "max": None}
    return {
        "count": len(values),
        "median": round(statistics.median(values), 3),
        "max": round(max(values), 3),
    }


def beat_figures(
    sends: Sequence[Mapping[str, Any]],
    elections: Sequence[Mapping[str, Any]],
    faults: Sequence[Fault],
    *,
    lease: float,
) -> dict[str, Any]:
    """The beat replicas' figures: slots sent (as the leader's ``beat_slot_sent`` recorded
    them in the ledger), slots sent twice while the lock Redis kept its data (and after a
    restart that lost it), elections, and the failover after each leader kill (the kill to
    the first slot sent by another replica)."""
    restarts = [fault.at for fault in faults if fault.kind == "redis_restart"]
    seen: dict[tuple[str, int], Mapping[str, Any]] = {}
    twice = twice_after_loss = 0
    for send in sorted(sends, key=lambda line: float(line["t"])):
        slot = (str(send["entry"]), int(send["slot"]))
        if slot in seen:
            if any(at <= float(send["t"]) <= at + lease + 5 for at in restarts):
                twice_after_loss += 1
            else:
                twice += 1
        seen[slot] = send
    failovers: list[float | None] = []
    for fault in faults:
        if fault.kind != "beat_kill" or fault.detail == "no beat leader found":
            continue
        before = [s for s in sends if float(s["t"]) <= fault.at]
        killed = before[-1]["replica"] if before else None
        after = [
            float(s["t"]) for s in sends if float(s["t"]) > fault.at and s["replica"] != killed
        ]
        failovers.append(round(min(after) - fault.at, 3) if after else None)
    return {
        "slots_sent": len(sends),
        "slots_sent_twice_data_kept": twice,
        "slots_sent_twice_after_data_loss": twice_after_loss,
        "caught_up": sum(bool(send.get("caught_up")) for send in sends),
        "elections": len(elections),
        "leader_kills": len(failovers),
        "failover": _summary([value for value in failovers if value is not None]),
        "failover_never": sum(value is None for value in failovers),
    }


def code_figures(
    code: Mapping[str, Any], reports: Mapping[str, Mapping[str, Any]], started: int
) -> dict[str, Any]:
    """What the soak's processes ran: the snapshot (``code``:
    :meth:`benchmarks.soak.code.Code.as_json`), how many processes the soak started and
    how many reported the code they imported, and those that ran other code
    (:func:`benchmarks.soak.code.other_code`)."""
    return {
        "revision": code.get("revision"),
        "digest": code["digest"],
        "scripts": code["scripts"],
        "processes_started": started,
        "processes_reported": len(reports),
        "other_code": other_code(reports, code),
    }


def analyse(
    snapshot: Snapshot,
    faults: Sequence[Fault],
    *,
    lease: float,
    lock_commands: int,
    modes: Mapping[str, Any] | None = None,
    beat: Mapping[str, Any] | None = None,
    code: Mapping[str, Any] | None = None,
) -> Results:
    """Judge one soak. ``modes``: the modes' verdict (:func:`benchmarks.soak.modes.summary`),
    whose violations outside a restart of the lock Redis are a safety target too.
    ``code``: :func:`code_figures`; a process that ran other code than the soak's snapshot
    fails the soak (its other figures judge a mixture of versions)."""
    restarts = [fault.at for fault in faults if fault.kind == "redis_restart"]
    found = overlaps(snapshot.bodies, restarts)
    kept = [item for item in found if not item.data_loss]
    lossy = [item for item in found if item.data_loss]
    fencing, continued = fencing_order(snapshot.bodies)
    lost, duplicates = lost_and_duplicates(snapshot)
    lost_received = [task_id for task_id in lost if task_id in snapshot.received]
    lost_in_transport = [task_id for task_id in lost if task_id not in snapshot.received]
    unreported = unreported_losses(snapshot)
    frozen, silent = paused_holders(snapshot, faults)
    lost_updates = [
        body for body in snapshot.bodies
        if body.outcome == "committed" and body.found is not None and body.found != body.seen
    ]  # fmt: skip
    lost_updates_kept = [
        body for body in lost_updates
        if not _restart_between(restarts, body.enter or 0.0, body.last or 0.0)
    ]  # fmt: skip
    missing = [body for body in snapshot.bodies if body.outcome == "missing"]
    missing_kept = [
        body for body in missing
        if not _restart_between(restarts, body.enter or 0.0, body.exit or 0.0)
    ]  # fmt: skip
    by_id = {body.id: body for body in snapshot.bodies}
    stalled = [
        by_id[body_id]
        for fault in faults
        if fault.kind == "net_stall"
        for body_id, _, _ in fault.held
        if body_id in by_id
    ]
    rows = recoveries(snapshot.bodies, faults)
    waited = [row["seconds"] for row in rows if row["kind"] == "soak.run_wait"]
    outcomes: dict[str, int] = defaultdict(int)
    for body in snapshot.bodies:
        outcomes[body.outcome or "killed"] += 1
    completed = sum(1 for task_id in snapshot.sent if snapshot.commits.get(task_id))
    skipped = sum(
        1 for task_id in snapshot.sent
        if snapshot.skips.get(task_id) and not snapshot.commits.get(task_id)
    )  # fmt: skip
    audits = sum(1 for body in snapshot.bodies if body.audited)
    handled = completed + skipped
    per_kind: dict[str, int] = defaultdict(int)
    for fault in faults:
        per_kind[fault.kind] += 1
    offsets: dict[str, float] = {}
    for body in snapshot.bodies:
        if abs(body.wall_offset) > abs(offsets.get(body.worker, 0.0)):
            offsets[body.worker] = round(body.wall_offset, 1)
    skewed = [b for b in snapshot.bodies if abs(b.wall_offset) > 60 and b.enter is not None]
    figures: dict[str, Any] = {
        "tasks_sent": len(snapshot.sent),
        "tasks_completed": completed,
        "tasks_skipped_by_policy": skipped,
        "bodies": len(snapshot.bodies),
        "body_outcomes": dict(sorted(outcomes.items())),
        "faults": dict(sorted(per_kind.items())),
        "faults_total": len(faults),
        "overlaps_data_kept": len(kept),
        "overlaps_after_data_loss": len(lossy),
        "overlap_seconds_after_data_loss": _summary([item.seconds for item in lossy]),
        "lost_tasks": len(lost_received),
        "lost_in_broker_transport": len(lost_in_transport),
        "duplicate_executions": len(duplicates),
        "fencing_order_violations": len(fencing),
        "holds_continued_by_a_retry": len(continued),
        "stale_writes_refused": len(snapshot.stale),
        "lost_updates_data_kept": len(lost_updates_kept),
        "lost_updates_after_data_loss": len(lost_updates) - len(lost_updates_kept),
        "holds_missing_data_kept": len(missing_kept),
        "holds_missing_after_data_loss": len(missing) - len(missing_kept),
        "unreported_losses": len(unreported),
        "paused_holders": frozen,
        "paused_holders_not_told": len(silent),
        "stalled_holders": len(stalled),
        "stalled_holders_saw_lease_lost": sum(1 for b in stalled if b.outcome == "lease_lost"),
        "lock_lost_signals": len(snapshot.lost_signals),
        "recovery_wait_policy": _summary([s for s in waited if s is not None]),
        "recovery_all": _summary([row["seconds"] for row in rows if row["seconds"] is not None]),
        "recovery_never": sum(1 for row in rows if row["seconds"] is None),
        "recovery_never_wait_policy": sum(
            1 for row in rows if row["seconds"] is None and row["kind"] == "soak.run_wait"
        ),
        "bodies_with_skewed_clock": len(skewed),
        "clock_offsets_by_process": dict(sorted(offsets.items())),
        "lock_commands": lock_commands,
        "lock_commands_per_task": round((lock_commands - 3 * audits) / handled, 2)
        if handled
        else None,
        "audit_reads": audits,
    }
    limit = lease + 1.0
    recovery_max = figures["recovery_wait_policy"]["max"]
    targets = [
        _target("overlaps while Redis kept its data", len(kept), "0", len(kept) == 0),
        _target(
            "lost tasks (after a worker received them)", len(lost_received), "0", not lost_received
        ),
        _target("fencing-order violations", len(fencing), "0", not fencing),
        _target(
            "lost updates while Redis kept its data",
            len(lost_updates_kept),
            "0",
            not lost_updates_kept,
        ),
        _target(
            "live holds missing while Redis kept its data", len(missing_kept), "0", not missing_kept
        ),
        _target("lost leases not reported to their holder", len(unreported), "0", not unreported),
        _target("paused holders not told their lease was lost", len(silent), "0", not silent),
        _target(
            "recovery after a crash, key with a waiting run (max s)",
            recovery_max,
            f"<= lease + 1 s = {limit:g}",
            recovery_max is not None
            and recovery_max <= limit
            and not figures["recovery_never_wait_policy"],
            safety=False,
        ),
    ]
    if beat is not None:
        figures["beat"] = dict(beat)
        twice = int(beat["slots_sent_twice_data_kept"])
        worst = beat["failover"]["max"]
        targets += [
            _target("beat slots sent twice while Redis kept its data", twice, "0", twice == 0),
            _target(
                "beat failover after a leader kill (max s)",
                worst,
                f"<= lease + 1 s = {limit:g}",
                worst is not None and worst <= limit and not beat["failover_never"],
                safety=False,
            ),
        ]
    if modes is not None:
        figures["modes"] = dict(modes)
        safe = int(modes["safe_violations"])
        targets += [
            _target("mode invariant violations while Redis kept its data", safe, "0", safe == 0),
            _target(
                "mode invariant violations across a restart of the lock Redis",
                int(modes["violations_after_restart_total"]),
                "reported",
                True,
                safety=False,
            ),
            _target(
                "mode calls lost by the broker transport (not the lock)",
                int(modes["lost_in_transport"]),
                "reported",
                True,
                safety=False,
            ),
        ]
    if code is not None:
        figures["code"] = dict(code)
        other = len(code["other_code"])
        name = "soak processes that ran other code than the soak's snapshot"
        targets.append(_target(name, other, "0", other == 0))
    examples: dict[str, list[Any]] = {
        "overlaps_data_kept": [vars(item) for item in kept[:5]],
        "overlaps_after_data_loss": [vars(item) for item in lossy[:5]],
        "lost_tasks": [
            [task, snapshot.sent[task], snapshot.received[task]] for task in lost_received[:10]
        ],
        "lost_in_broker_transport": [
            [task, snapshot.sent[task], _nearest(faults, snapshot.sent[task].get("t"))]
            for task in lost_in_transport[:10]
        ],
        "duplicates": duplicates[:10],
        "fencing_order_violations": fencing[:5],
        "holds_continued_by_a_retry": continued[:3],
        "unreported_losses": unreported[:5],
        "paused_holders_not_told": silent[:5],
        "mode_violations": list(modes["examples"]) if modes else [],
        "mode_violations_after_restart": list(modes["examples_after_restart"]) if modes else [],
        "bodies": [
            vars(body)
            for body in snapshot.bodies
            if body.id
            in {
                *silent[:5],
                *(pair[0] for pair in unreported[:5]),
                *(body_id for pair in fencing[:5] + continued[:3] for body_id in pair),
                *(item.first for item in kept[:5]),
                *(item.second for item in kept[:5]),
            }
        ],
    }
    return Results(figures, targets, rows, examples)


def _nearest(faults: Sequence[Fault], moment: float | None) -> dict[str, Any] | None:
    """The fault nearest to ``moment`` (seconds from it, kind, target)."""
    if moment is None or not faults:
        return None
    fault = min(faults, key=lambda item: abs(item.at - moment))
    return {"kind": fault.kind, "target": fault.target, "after_s": round(moment - fault.at, 3)}


def _target(name: str, value: Any, goal: str, met: bool, *, safety: bool = True) -> dict[str, Any]:
    return {"name": name, "value": value, "target": goal, "met": bool(met), "safety": safety}
