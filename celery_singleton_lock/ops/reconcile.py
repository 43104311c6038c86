"""Reconciliation: who holds, waits for and follows each lock (``celery locks list``), and
freeing only holds whose holder is proven gone (``celery locks reap``).

No answer is not proof. A worker on the solo pool busy in a long task, or one started
with ``worker_enable_remote_control=False``, never answers ``inspect``, and a hold whose
lease was not renewed for a while may belong to a run whose renewer is only late (a
stalled connection, a stopped process). So a hold is freed only on one of these proofs:

* **its lease ran out** (its expiry passed while its value stayed the same): by the lock's
  own rule it is free already; freeing it now wakes its waiters at once;
* **its process is gone**: a run's hold names its process (boot id, PID namespace, pid and
  start time, see :mod:`celery_singleton_lock.runtime.process`); when that is a process
  of this very host and namespace and no such process runs any more, the body cannot be
  running (a run hold is never renewed from another process);
* **taken at publish and its message is nowhere** (queue scope, holder info
  ``"queued": true``, which is never renewed while queued): the broker is Redis and every
  queue a message of the app can be in was searched (the default queue, ``task_queues``,
  every queue named in ``task_routes`` and in the tasks' ``queue`` options, every queue
  bound on the broker, which includes those named by ``apply_async(queue=...)``, each
  with its priority lists) along with the messages delivered but not acknowledged, twice,
  a moment apart. A router function in ``task_routes`` (its queues cannot be listed), a
  queue too long to read or a broker that is not Redis leave such a hold unproven.

Each also needs: the value did not change while we watched, and no worker that answers
``inspect`` (``query_task``) knows the task; a process gone or a lease run out also needs
its message not to wait in the broker (a redelivery would run it). Anything else is
reported *unproven*, with why, and left alone; a hold whose lease moved while we watched,
whose task a worker reports or whose message waits in the broker is alive and not
reported at all.

How long to watch. A live run renews its lease every third of the lease. A hold written
(acquired or renewed) at ``w`` with lease ``L`` expires at ``E = w + L`` and its renewal
is due at ``w + L/3 = E - 2L/3``. When we first see it at ``t0`` (so ``w <= t0``), that
is at most ``t0 + (E - t0)/3``: a third of the lease it has left then. So watching each
hold a third of its lease left (plus a margin for the renewer's scheduling) is enough to
see a live renewer renew, whatever its lease (a task's own ``lock_timeout``, a per-call
one, a task this app does not know), without knowing ``L``. Not seeing that renewal is
still no proof (above), so the watch only decides what is reported: alive (renewed) or
unproven (not renewed). Freeing is owner-checked by the owner token we saw, so a hold
that changed hands meanwhile (claimed by its run, renewed, released, taken) is left.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from celery_singleton_lock.engine import RedisLock, companion_key
from celery_singleton_lock.engine.constants import MAX_DURATION
from celery_singleton_lock.engine.value import LockValue, parse_value
from celery_singleton_lock.engine.wire import LockClient, server_time
from celery_singleton_lock.modes.lifetime import held_after_success
from celery_singleton_lock.modes.parking import parked_count
from celery_singleton_lock.modes.pending import pending_id
from celery_singleton_lock.ops.admin import LockRow, decode_key, lock_row, scan_values
from celery_singleton_lock.ops.evidence import (
    INSPECT_TIMEOUT,
    BrokerSearch,
    _WorkerQuery,
    _Workers,
    search_broker,
)
from celery_singleton_lock.runtime.process import process_state

if TYPE_CHECKING:
    from celery import Celery

__all__ = [
    "BrokerSearch",
    "LockState",
    "Reaped",
    "base_of",
    "lock_states",
    "reap",
    "search_broker",
    "watch_seconds",
]

#: A live renewer extends a lease a third of a lease after writing it; we allow it this
#: much longer: a tenth more, plus a second (its lane's scheduling, a slow round trip).
RENEWAL_SLACK = 1.0
RENEWAL_SLACK_FRACTION = 0.1
#: Without ``--watch``, a hold taken at publish (never renewed while queued) is watched
#: this long, so a message still being published when we first looked has landed.
QUEUED_WATCH = 5.0
#: A message found nowhere is looked for again this much later before its hold is freed: a
#: worker that is taking it has popped it from its queue but not yet put it among the
#: unacknowledged messages, or has acknowledged it and is about to claim the hold.
SETTLE = 1.0
#: How often the watched holds are read again (seconds).
POLL_INTERVAL = 0.25


def base_of(key: str) -> tuple[str, str]:
    """(lock key, companion suffix) of a key under the prefix: a lock key has suffix ``""``;
    ``<lock>:slot:2`` gives the lock and ``"slot:2"``; ``<lock>:queue`` gives ``"queue"``."""
    close = key.find("}")
    if close != -1 and key.startswith(":", close + 1):
        return key[: close + 1], key[close + 2 :]
    return key, ""


@dataclass
class LockState:
    """One lock as ``locks list`` shows it: its holders (one per slot held), the waiters in
    the order they came (their task ids), its pending follow-up (a task id) and how many
    calls are parked on it (``lock_on_conflict="park"``)."""

    key: str
    holders: list[LockRow] = field(default_factory=list)
    waiters: list[str] = field(default_factory=list)
    pending: str | None = None
    parked: int = 0

    def as_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "holders": [row.as_json() for row in self.holders],
            "waiters": self.waiters,
            "pending": self.pending,
            "parked": self.parked,
        }


def lock_states(client: LockClient, pattern: str) -> list[LockState]:
    """Every lock under ``pattern`` with its holders (slots included), waiters and pending
    follow-up; companion keys are folded into their lock, never listed as locks."""
    states: dict[str, LockState] = {}
    for key, raw, ttl, now_ms in scan_values(client, pattern):
        lock, suffix = base_of(key)
        if suffix and not suffix.startswith("slot:"):
            continue  # a companion: queue, waiter, grant, signal, done, fence, ...
        if raw is None or isinstance(raw, Exception):
            continue
        row = lock_row(key, raw, ttl, now_ms)
        if row.kind == "foreign" and suffix:
            continue
        states.setdefault(lock, LockState(lock)).holders.append(row)
    for state in states.values():
        state.waiters, state.pending = _queue_of(client, state.key)
        with contextlib.suppress(ValueError):
            state.parked = parked_count(client, state.key)
    return [states[key] for key in sorted(states)]


def _queue_of(client: LockClient, key: str) -> tuple[list[str], str | None]:
    """The task ids of ``key``'s live waiters in order, and its pending follow-up's."""
    try:
        queue = companion_key(key, "queue")
    except ValueError:
        return [], None
    tokens = [decode_key(token) for token in cast("list[bytes]", client.zrange(queue, 0, -1))]
    pending = pending_id(client, key)
    waiters = []
    if tokens:
        values = client.mget([companion_key(key, f"waiter:{token}") for token in tokens])
        for token, value in zip(tokens, values, strict=True):
            if value is None:
                continue  # its place lapsed
            text = decode_key(value).split(":", 1)[-1]
            try:
                info = json.loads(text)
            except ValueError:
                info = {}
            waiters.append(str(info.get("task_id") or token) if isinstance(info, dict) else token)
    return waiters, pending


@dataclass(frozen=True)
class Reaped:
    """One hold ``reap`` reports: its key, task id and why. ``proven``: its holder is
    proven gone, and ``freed`` says whether it was freed (never in a dry run, nor when it
    changed hands meanwhile); not ``proven``: it may still be in use and was left alone."""

    key: str
    task_id: str | None
    why: str
    freed: bool
    proven: bool = True


# ------------------------------------------------------------------------------ holds


@dataclass
class _Watched:
    """One hold as reap watches it: the value first seen (at server time ``seen_ms``), and
    what the watch showed."""

    row: LockRow
    raw: bytes | str
    value: LockValue
    seen_ms: int
    now_ms: int
    changed: bool = False
    process: str | None = None  # "gone" / "running" / None (cannot tell), for run holds

    @property
    def expiry_ms(self) -> int:
        return self.value.expiry_ms or 0

    @property
    def expired(self) -> bool:
        """Its lease ran out with the value we first saw (never renewed)."""
        return not self.changed and self.expiry_ms <= self.now_ms

    @property
    def due_ms(self) -> int:
        """When a live holder has surely renewed it (see the module docstring); for a hold
        taken at publish, never renewed while queued, when its publish has surely landed."""
        if self.row.queued:
            return self.seen_ms + int(QUEUED_WATCH * 1000)
        left = max(0, self.expiry_ms - self.seen_ms)
        return self.seen_ms + int(left / 3 * (1 + RENEWAL_SLACK_FRACTION) + RENEWAL_SLACK * 1000)

    @property
    def watched(self) -> float:
        return max(0.0, (self.now_ms - self.seen_ms) / 1000)

    def settled(self, *, until_due: bool) -> bool:
        """Whether watching longer can tell nothing more (``until_due``: once its renewal
        was due, the default watch)."""
        if self.changed or self.expired or self.process == "gone":
            return True
        return until_due and self.now_ms >= self.due_ms

    def observe(self, raw: object, now_ms: int) -> None:
        if self.changed:
            return
        self.now_ms = now_ms
        if raw != self.raw:
            self.changed = True  # renewed, released, claimed by its run, taken by another
        elif not self.row.queued:
            self.process = process_state(self.row.info)


def _read(client: LockClient, keys: Sequence[str]) -> tuple[int, list[Any]]:
    """The server time (ms) and the values of ``keys`` (None: gone; an error: not a string)."""
    now_ms, _ = server_time(client)
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.get(key)
    return now_ms, list(pipe.execute(raise_on_error=False))


def _first_sight(client: LockClient, rows: Sequence[LockRow]) -> list[_Watched]:
    """The holds to watch among ``rows``: this package's locks, held or with their lease run
    out, by a value with an owner token (so it can be freed owner-checked), not a success
    hold (``lock_release="success"`` keeps the key on purpose)."""
    now_ms, raws = _read(client, [row.key for row in rows])
    watched = []
    for row, raw in zip(rows, raws, strict=True):
        if not isinstance(raw, (bytes, str)):
            continue
        value = parse_value(raw)
        fresh = lock_row(row.key, raw, -1, now_ms)
        if fresh.kind != "lock" or value.token is None or held_after_success(fresh.info):
            continue
        hold = _Watched(fresh, raw, value, seen_ms=now_ms, now_ms=now_ms)
        hold.observe(raw, now_ms)
        watched.append(hold)
    return watched


def reap(
    app: Celery,
    client: LockClient,
    pattern: str,
    *,
    watch: float | None,
    dry_run: bool,
    scripting: bool = True,
    inspect_timeout: float = INSPECT_TIMEOUT,
    announce: Callable[[int, float], None] | None = None,
) -> list[Reaped]:
    """Free (unless ``dry_run``) every hold under ``pattern`` whose holder is proven gone,
    and report the holds that are neither proven gone nor seen alive (see the module
    docstring). ``watch``: how long to watch for renewals (seconds); None watches each hold
    until its renewal was due. ``announce(holds, seconds)`` is called before watching."""
    rows = [row for state in lock_states(client, pattern) for row in state.holders]
    holds = _first_sight(client, rows)
    if not holds:
        return []
    task_ids = sorted({hold.row.task_id for hold in holds if hold.row.task_id is not None})
    workers = _WorkerQuery(app, task_ids, inspect_timeout)
    workers.start()
    _watch(client, holds, watch, announce)
    answer = workers.answer()
    left = [hold for hold in holds if not hold.changed]
    if not left:
        return []
    searched = any(hold.row.queued or hold.expired or hold.process == "gone" for hold in left)
    broker = search_broker(app) if searched else BrokerSearch(why="not searched")
    verdicts = [(hold, _verdict(hold, answer, broker)) for hold in left]
    verdicts = _settle(app, client, verdicts, answer)
    reaped = []
    for hold, (proven, why) in verdicts:
        if why is None:
            continue  # alive
        freed = proven and not dry_run and _free(client, hold, scripting)
        reaped.append(Reaped(hold.row.key, hold.row.task_id, why, freed, proven))
    return reaped


def _watch(
    client: LockClient,
    holds: Sequence[_Watched],
    watch: float | None,
    announce: Callable[[int, float], None] | None,
) -> None:
    """Read the holds again every ``POLL_INTERVAL`` until ``watch`` seconds passed (None:
    until each one's renewal was due), or sooner once watching can tell nothing more."""
    until_due = watch is None
    started = time.monotonic()
    if watch is None:
        seen = min(hold.seen_ms for hold in holds)
        seconds = max(0.0, (max(hold.due_ms for hold in holds) - seen) / 1000)
    else:
        seconds = max(0.0, watch)
    if announce is not None:
        announce(len(holds), seconds)
    deadline = started + seconds
    while True:
        open_holds = [hold for hold in holds if not hold.settled(until_due=until_due)]
        left = deadline - time.monotonic()
        if not open_holds or left <= 0:
            return
        time.sleep(min(POLL_INTERVAL, left))
        now_ms, raws = _read(client, [hold.row.key for hold in open_holds])
        for hold, raw in zip(open_holds, raws, strict=True):
            hold.observe(raw, now_ms)


_Verdict = tuple[bool, str | None]


def _verdict(hold: _Watched, workers: _Workers, broker: BrokerSearch) -> _Verdict:
    """(proven gone, why) of a hold whose value did not change while watched; why None
    when it is alive (a worker has its task, or its message waits in the broker)."""
    task_id = hold.row.task_id
    if task_id is not None and task_id in workers.known:
        return False, None
    found = broker.has(task_id) if task_id is not None else False
    if hold.expired:
        if found:
            return False, "its lease ran out, but its message is still in the broker"
        return True, "its lease ran out without a renewal"
    if hold.row.queued:
        if found is None:
            return False, f"taken at publish, and its message may still be queued: {broker.why}"
        if found:
            return False, None
        return True, "taken at publish, but its message is in no queue and no worker has it"
    if hold.process == "gone":
        where = f"{hold.row.host or '?'}/{hold.row.pid if hold.row.pid is not None else '?'}"
        if found:
            return False, f"its process ({where}) is gone, but its message is still in the broker"
        return True, f"not renewed while watched, and its process ({where}) is gone"
    return False, _unproven_run(hold, workers)


def _unproven_run(hold: _Watched, workers: _Workers) -> str:
    """Why a run's hold that was not renewed while watched is not proven gone."""
    left = max(0.0, (hold.expiry_ms - hold.now_ms) / 1000)
    if hold.now_ms >= hold.due_ms:
        seen = f"not renewed in {hold.watched:.1f}s, though a live run renews within that"
    else:
        due = (hold.due_ms - hold.seen_ms) / 1000
        seen = (
            f"watched {hold.watched:.1f}s, less than its renewal interval "
            f"(its renewal is due within {due:.1f}s)"
        )
    if hold.row.task_id is None:
        who = "not a task's hold, so no worker can say"
    elif hold.process == "running":
        who = "its process still runs on this host"
    elif workers.answered:
        who = "no answering worker has it, but the worker running it may not answer inspect"
    else:
        who = "no worker answered inspect (a busy solo worker or one with remote control off)"
    return f"{seen}; {who}; its lease ends in {left:.1f}s unless renewed"


def _settle(
    app: Celery,
    client: LockClient,
    verdicts: list[tuple[_Watched, _Verdict]],
    workers: _Workers,
) -> list[tuple[_Watched, _Verdict]]:
    """Look again, ``SETTLE`` seconds later, for the messages of holds taken at publish that
    were found nowhere: one a worker was taking then is among the unacknowledged messages,
    or its hold was claimed by the run."""
    pending = [
        index
        for index, (hold, (proven, _)) in enumerate(verdicts)
        if proven and hold.row.queued and not hold.expired
    ]
    if not pending:
        return verdicts
    time.sleep(SETTLE)
    broker = search_broker(app)
    now_ms, raws = _read(client, [verdicts[index][0].row.key for index in pending])
    settled = list(verdicts)
    for index, raw in zip(pending, raws, strict=True):
        hold = verdicts[index][0]
        hold.observe(raw, now_ms)
        settled[index] = (hold, (False, None) if hold.changed else _verdict(hold, workers, broker))
    return settled


def _free(client: LockClient, hold: _Watched, scripting: bool) -> bool:
    """Owner-checked release of the hold by the owner token we saw: a hold that changed
    hands since (claimed by its run under a token of its own, taken by another) is left."""
    lock, suffix = base_of(hold.row.key)
    limit = int(suffix.split(":", 1)[1]) if suffix.startswith("slot:") else 1
    # With scripts, released as a slot (limit >= 2): the slot index beside the lock is kept
    # right (a plain lock has none, and the release leaves it so).
    owner = RedisLock(
        client,
        lock,
        token=hold.value.token,
        scripting=scripting,
        limit=max(limit, 2) if scripting else 1,
    )
    try:
        owner.release()
    except Exception:  # noqa: BLE001 - not owned any more, or Redis refused: not freed
        return False
    return True


def watch_seconds(value: float | None) -> float | None:
    """``value`` as a watch time (``--watch``): None (each hold until its renewal was due)
    or seconds, a finite number from 0 up to a year; ValueError otherwise."""
    if value is not None and not (math.isfinite(value) and 0 <= value <= MAX_DURATION):
        raise ValueError(f"must be a number of seconds from 0 to {MAX_DURATION}, got {value!r}")
    return value
