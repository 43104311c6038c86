"""The Celery app of the chaos soak: the locked tasks, and the bodies that audit them.

The driver (:mod:`benchmarks.soak.run`), every ``celery worker`` and the ``celery beat`` of
a soak import this module; the servers come from the environment:

- ``CSL_SOAK_BROKER``: the broker (a private redis-server that no fault touches);
- ``CSL_SOAK_RESULTS``: the result backend of the modes' tasks (on the broker's server;
  the soak's own tasks store no result);
- ``CSL_SOAK_LOCK``: the lock Redis as this process reaches it (a worker: through its own
  fault proxy; the driver and the beat: directly);
- ``CSL_SOAK_LEDGER``: the ledger (:mod:`benchmarks.soak.ledger`);
- ``CSL_SOAK_LEASE``: ``lock_timeout`` of every task (seconds);
- ``CSL_SOAK_WORKER``: a label for this process's records (``w1``, ``beat``, ``driver``);
- ``CSL_SOAK_CLOCK_SKEW``: seconds added to ``time.time()`` / ``time.time_ns()`` in this
  worker's pool processes (where the task bodies and their locks run);
- ``CSL_SOAK_CODE``: set in every worker and beat the soak starts (from its snapshot of the
  code, :mod:`benchmarks.soak.code`): the process reports the code it imported to the
  ledger (``CODE_REPORTS``) as it imports this module.

Every task runs :func:`work`: it enters the ledger's fenced resource for its key with its
fencing token, writes a heartbeat every step while ``current_lock().lease_lost`` is False,
checks once that the server still has its hold, and commits a read-increment-write. A
body that finds its lease lost, its write refused by fencing, or its hold missing stops
and retries the task, so the work is done exactly once by a run that held the lock.

The modes (:mod:`tests.invariants.modes`: coalesce, replace, debounce, throttles, slots,
lifetimes, ...) are tasks of this app too, ``soak.mode.<mode>``, whose bodies record to
the ledger's server under ``modes:*`` (:mod:`benchmarks.soak.modes` drives and judges
them).
"""

from __future__ import annotations

import json
import math
import os
import time
import uuid
from typing import TYPE_CHECKING, Any

from celery import Celery, signals

from benchmarks.soak.code import imported
from benchmarks.soak.ledger import Body, Ledger
from celery_singleton_lock import LockedTask, LockError, current_lock
from celery_singleton_lock.signals import beat_elected, beat_slot_sent, lock_lost
from tests.invariants.modes import register
from tests.invariants.recording import Recorder

if TYPE_CHECKING:
    from celery import Task

    from celery_singleton_lock import RedisLock

    AnyTask = Task[Any, Any]
else:
    AnyTask = Any

BROKER = os.environ.get("CSL_SOAK_BROKER", "redis://127.0.0.1:6379/0")
RESULTS = os.environ.get("CSL_SOAK_RESULTS") or None
LOCK = os.environ.get("CSL_SOAK_LOCK", "redis://127.0.0.1:6379/1")
LEASE = float(os.environ.get("CSL_SOAK_LEASE", "3"))
WORKER = os.environ.get("CSL_SOAK_WORKER", "driver")
#: Seconds after which the broker hands an unacknowledged message out again (a worker
#: killed whole never acknowledges its messages); tasks wait far less than this.
VISIBILITY_TIMEOUT = 30.0
#: Seconds between the steps of a body (a heartbeat write each).
STEP = 0.04

#: Task names, and the lock keys each is driven over (a few keys: constant contention).
RUN_WAIT = "soak.run_wait"
RUN_RETRY = "soak.run_retry"
QUEUED = "soak.queued"
BEAT_JOB = "soak.beat_job"
KEYS: dict[str, tuple[str, ...]] = {
    RUN_WAIT: ("w0", "w1", "w2"),
    RUN_RETRY: ("r0", "r1"),
    QUEUED: ("q0", "q1"),
    BEAT_JOB: ("beat",),
}

app = Celery("csl_soak", broker=BROKER, set_as_current=True)
app.conf.update(
    task_ignore_result=True,  # the modes' tasks store theirs (ignore_result=False)
    result_backend=RESULTS,
    result_expires=3600,
    result_backend_transport_options={"retry_policy": {"max_retries": 2, "interval_max": 0.2}},
    task_default_queue="soak",
    # At least once: a message is acknowledged after its run, and a run whose pool process
    # died is handed out again.
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    broker_transport_options={
        "visibility_timeout": VISIBILITY_TIMEOUT,
        # kombu sweeps unacknowledged messages every interval x throttle seconds (100 s by
        # default): every 2 s here, so a killed worker's messages come back in ~32 s.
        "unacked_restore_interval": 2,
        "unacked_restore_throttle": 1,
        # The sweep runs under a broker-side mutex whose default expiry is 300 s: a worker
        # killed while it sweeps would stop every sweep for 5 minutes.
        "unacked_mutex_expire": 10,
    },
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=True,
    singleton_lock_url=LOCK,
    singleton_lock_timeout=LEASE,
    # Three beat replicas run celery_singleton_lock.beat:LeaderScheduler: one leads.
    singleton_beat_lease=LEASE,
    beat_schedule={
        "locked-job": {"task": BEAT_JOB, "schedule": 1.0, "args": ("beat", 25)},
    },
)


#: The ledger's lists of the beat replicas: every slot the leader sent, every election.
BEAT_SENT, BEAT_ELECTED = "beat:sent", "beat:elected"
#: The ledger's hash of what each process imported: ``"<label>:<pid>"`` -> JSON.
CODE_REPORTS = "code"


def _beat_sent(sender: Any = None, **named: Any) -> None:
    """In a beat replica: record each slot its leader sent, outside the lock Redis."""
    line = {
        "entry": named.get("entry"),
        "slot": int(named["scheduled"].timestamp() * 1000),
        "replica": getattr(sender, "replica", None),
        "fence": named.get("fencing_token"),
        "caught_up": named.get("caught_up"),
        "t": time.monotonic(),
        "wall": time.time(),
    }
    Ledger.for_process().client.rpush(BEAT_SENT, json.dumps(line))


def _beat_elected(sender: Any = None, **named: Any) -> None:
    line = {"replica": named.get("replica"), "fence": named.get("fencing_token"),
            "t": time.monotonic()}  # fmt: skip
    Ledger.for_process().client.rpush(BEAT_ELECTED, json.dumps(line))


def _trusted(lock: RedisLock) -> float | None:
    """Now (monotonic), if the lease is still valid now, else None. ``lease_lost`` reads the
    clock after this one, so a False answer vouches for the moment returned."""
    moment = time.monotonic()
    return None if lock.lease_lost else moment


def _still_held(lock: RedisLock) -> bool | None:
    """Whether the server still has this hold (None when it cannot be asked now)."""
    try:
        return lock.owned()
    except LockError:
        return None


def work(task: AnyTask, kind: str, key: str, steps: int) -> str:
    """The audited body of every soak task (see the module docstring)."""
    lock = current_lock()
    if lock is None:
        raise RuntimeError(f"{kind} ran without a lock")
    ledger = Ledger.for_process()
    body = Body(
        id=uuid.uuid4().hex, task_id=str(task.request.id), kind=kind, key=key,
        token=lock.fencing_token or 0, pid=os.getpid(), worker=WORKER,
    )  # fmt: skip
    ledger.open(body, time.time())
    outcome = "committed"
    at = _trusted(lock)
    if at is None:
        outcome = "lease_lost"
    else:
        accepted, seen = ledger.write(body, "enter", at)
        if not accepted:
            outcome = "refused"
        for _ in range(steps if accepted else 0):
            time.sleep(STEP)
            at = _trusted(lock)
            if at is None:
                outcome = "lease_lost"
                break
            if not ledger.write(body, "beat", at)[0]:
                outcome = "refused"
                break
        if outcome == "committed":
            held = _still_held(lock)
            body.audited = True
            at = _trusted(lock)
            if at is None:
                outcome = "lease_lost"
            elif held is False:
                outcome = "missing"  # the server lost a hold whose lease is still valid
            elif not ledger.write(body, "commit", at, seen)[0]:
                outcome = "refused"
    ledger.close(body, outcome, time.monotonic(), committed=outcome == "committed")
    if outcome != "committed":
        # The work was not done under the lock: do it again, under a lock, later.
        raise task.retry(countdown=0.5, max_retries=None)
    return outcome


@app.task(
    base=LockedTask, name=RUN_WAIT, bind=True, lock_keys=["key"], lock_on_conflict="wait",
    lock_wait=math.inf, max_retries=None,
)  # fmt: skip
def run_wait(self: AnyTask, key: str, steps: int) -> str:
    """Run scope, waits for the key (woken by the release)."""
    return work(self, RUN_WAIT, key, steps)


@app.task(
    base=LockedTask, name=RUN_RETRY, bind=True, lock_keys=["key"], lock_on_conflict="retry",
    max_retries=None,
)  # fmt: skip
def run_retry(self: AnyTask, key: str, steps: int) -> str:
    """Run scope, comes back later when the key is held."""
    return work(self, RUN_RETRY, key, steps)


@app.task(base=LockedTask, name=QUEUED, bind=True, lock_keys=["key"], lock_scope="queue")
def queued(self: AnyTask, key: str, steps: int) -> str:
    """Queue scope: a duplicate call while one is queued or running publishes nothing."""
    return work(self, QUEUED, key, steps)


@app.task(base=LockedTask, name=BEAT_JOB, bind=True, lock_keys=(), lock_scope="queue")
def beat_job(self: AnyTask, key: str, steps: int) -> str:
    """The periodic job beat sends every second; a tick while one is queued or running
    publishes nothing."""
    return work(self, BEAT_JOB, key, steps)


# -- the ledger's view of publishing and of the lock's signals -------------------------------


def _on_published(sender: Any = None, headers: Any = None, body: Any = None, **_: Any) -> None:
    """Every publish of a soak task, in whichever process published it."""
    headers = headers or {}
    task, task_id = headers.get("task"), headers.get("id")
    if task not in KEYS or not task_id:
        return
    args = body[0] if isinstance(body, (list, tuple)) and body else ()
    key = str(args[0]) if args else ""
    Ledger.for_process().sent(str(task_id), str(task), key, time.monotonic(), WORKER)


def _on_received(sender: Any = None, request: Any = None, **_: Any) -> None:
    """A worker's consumer took a soak task from the broker."""
    if getattr(request, "name", None) in KEYS:
        Ledger.for_process().received(str(request.id), WORKER, time.monotonic())


def _on_postrun(sender: Any = None, task_id: Any = None, retval: Any = None, state: Any = None,
                **_: Any) -> None:  # fmt: skip
    """A run that ended successfully without its body (the conflict policy skipped it, or
    an earlier delivery had finished the work) counts as handled by design."""
    if getattr(sender, "name", None) in KEYS and state == "SUCCESS" and retval is None:
        Ledger.for_process().skipped(str(task_id))


def _on_lock_lost(sender: Any = None, task_id: Any = None, fencing_token: Any = None,
                  key: Any = None, **_: Any) -> None:  # fmt: skip
    """The run learned at its end that its lease was lost."""
    token = int(fencing_token) if fencing_token is not None else None
    Ledger.for_process().lost_signal(str(task_id), token, str(key), time.monotonic())


def _skew_clock(**_: Any) -> None:
    """In a pool process of the skewed worker: shift the wall clock (``time.time`` and
    ``time.time_ns``) by ``CSL_SOAK_CLOCK_SKEW`` seconds. The lock reads the Redis
    server's clock, so this must change nothing about exclusion."""
    skew = float(os.environ.get("CSL_SOAK_CLOCK_SKEW") or 0)
    if not skew:
        return
    real_time, real_time_ns = time.time, time.time_ns
    time.time = lambda: real_time() + skew
    time.time_ns = lambda: real_time_ns() + round(skew * 1e9)


#: The modes' tasks (``soak.mode.<mode>``) and the recorder of their bodies.
MODES_PREFIX = "soak.mode"
MODES_RECORDER = Recorder(
    os.environ.get("CSL_SOAK_LEDGER", "redis://127.0.0.1:6379/2"), "modes", MODES_PREFIX, WORKER
)
MODES_RECORDER.connect()
MODE_TASKS = register(app, MODES_RECORDER.body, prefix=MODES_PREFIX)

signals.after_task_publish.connect(_on_published, weak=False, dispatch_uid="soak.published")
signals.task_received.connect(_on_received, weak=False, dispatch_uid="soak.received")
signals.task_postrun.connect(_on_postrun, weak=False, dispatch_uid="soak.postrun")
signals.worker_process_init.connect(_skew_clock, weak=False, dispatch_uid="soak.skew")
lock_lost.connect(_on_lock_lost, weak=False, dispatch_uid="soak.lock_lost")
beat_slot_sent.connect(_beat_sent, weak=False, dispatch_uid="soak.beat_sent")
beat_elected.connect(_beat_elected, weak=False, dispatch_uid="soak.beat_elected")

if os.environ.get("CSL_SOAK_CODE"):
    # A worker or beat replica the soak started: say which code it runs (the soak fails
    # when it is not the snapshot the soak began with).
    Ledger.for_process().client.hset(CODE_REPORTS, f"{WORKER}:{os.getpid()}",
                                     json.dumps(imported()))  # fmt: skip
