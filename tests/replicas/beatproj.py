"""The Celery app of the beat-replica tests and of ``benchmarks.beat_failover``: a schedule
of entries every 1 s and every 5 s, whose task records each send in a ledger outside the
lock Redis.

Configured from the environment (every process of a run gets the same):

- ``CSL_BEAT_BROKER``: the broker (a private redis-server);
- ``CSL_BEAT_LOCK``: the lock Redis (another one, or a fault proxy in front of it);
- ``CSL_BEAT_LEDGER``: where the task appends one JSON line per run (a Redis list
  ``ledger`` on the broker's server, database 2 by default);
- ``CSL_BEAT_LEASE``: ``singleton_beat_lease``; ``CSL_BEAT_CATCH_UP``: the catch-up rule;
- ``CSL_BEAT_SCHEDULER``: ``singleton_beat_scheduler`` (default: Celery's
  ``PersistentScheduler``; ``tests.replicas.beatproj:CountingScheduler`` is a user's own
  subclass);
- ``CSL_BEAT_REDBEAT``: ``1`` runs the same schedule under RedBeat instead (its own lock,
  ``redbeat_lock_timeout`` = the lease), for the side-by-side comparison;
- ``CSL_BEAT_ENTRIES``: which entries (``fast,slow,cron,byname``), default all but cron.
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

import redis
from celery import Celery, Task, signals
from celery.beat import PersistentScheduler
from celery.schedules import crontab, schedule

from celery_singleton_lock.beat import scheduled_slot

BROKER = os.environ.get("CSL_BEAT_BROKER", "redis://127.0.0.1:6379/0")
LOCK = os.environ.get("CSL_BEAT_LOCK", BROKER)
LEDGER = os.environ.get("CSL_BEAT_LEDGER", BROKER.rsplit("/", 1)[0] + "/2")
LEASE = float(os.environ.get("CSL_BEAT_LEASE", "3"))
CATCH_UP = os.environ.get("CSL_BEAT_CATCH_UP", "once")
REDBEAT = os.environ.get("CSL_BEAT_REDBEAT") == "1"
ENTRIES = os.environ.get("CSL_BEAT_ENTRIES", "fast,slow,byname").split(",")

app = Celery("beatproj", broker=BROKER, set_as_current=True)


class CountingScheduler(PersistentScheduler):
    """A user's own scheduler class (wrapped by ``LeaderScheduler``): counts the entries
    it reserves, in its ``info``."""

    reserved = 0

    def reserve(self, entry: Any) -> Any:
        type(self).reserved += 1
        return super().reserve(entry)

    @property
    def info(self) -> str:
        return f"    . counting scheduler ({self.reserved} reserved)"


class ChangingScheduler(CountingScheduler):
    """A user's scheduler whose schedule changes at run time, as django-celery-beat's does
    when its table changes: the period of entry ``fast`` is read, at each access, from the
    ledger's key ``beatproj:fast-every`` (seconds) when it is set."""

    def get_schedule(self) -> Any:
        entries = PersistentScheduler.get_schedule(self)
        every = ledger().get("beatproj:fast-every")
        if every is not None and "fast" in entries:
            wanted = schedule(float(every))
            if entries["fast"].schedule != wanted:
                entries["fast"].schedule = wanted
        return entries

    schedule = property(get_schedule, PersistentScheduler.set_schedule)  # type: ignore[assignment]


SCHEDULE: dict[str, dict[str, Any]] = {
    "fast": {"task": "beatproj.record", "schedule": 1.0, "args": ("fast",)},
    "slow": {"task": "beatproj.record", "schedule": schedule(5.0), "args": ("slow",)},
    "cron": {"task": "beatproj.record", "schedule": crontab(), "args": ("cron",)},
    # sent by name: no task of that name is registered in the beat process
    "byname": {"task": "beatproj.unregistered", "schedule": 1.0, "args": ("byname",)},
}

app.conf.update(
    task_ignore_result=True,
    task_default_queue="beatproj",
    broker_connection_retry_on_startup=True,
    singleton_lock_url=LOCK,
    singleton_beat_lease=LEASE,
    singleton_beat_catch_up=CATCH_UP,
    beat_schedule={name: SCHEDULE[name] for name in ENTRIES if name},
)
# Anything else, as JSON (the start-refusal tests set bad values here).
app.conf.update(json.loads(os.environ.get("CSL_BEAT_CONF", "{}")))
if os.environ.get("CSL_BEAT_SCHEDULER"):
    app.conf.singleton_beat_scheduler = os.environ["CSL_BEAT_SCHEDULER"]
if REDBEAT:
    app.conf.update(
        redbeat_redis_url=LOCK,
        redbeat_key_prefix="redbeat-test:",
        redbeat_lock_timeout=int(LEASE),
        beat_max_loop_interval=max(1, int(LEASE) // 3),
    )

if os.environ.get("CSL_BEAT_METRICS_PORT"):
    from celery_singleton_lock import metrics

    metrics.enable()

    @signals.beat_init.connect
    def _serve_metrics(**_: Any) -> None:
        """Serve the beat counters from the beat process (as docs/beat.md shows)."""
        metrics.serve(int(os.environ["CSL_BEAT_METRICS_PORT"]), addr="127.0.0.1")


_ledger: redis.Redis | None = None


def ledger() -> redis.Redis:
    global _ledger  # noqa: PLW0603 - one client per process
    if _ledger is None:
        _ledger = redis.Redis.from_url(LEDGER, socket_timeout=10)
    return _ledger


def _write(task: Task[Any, Any], name: str) -> None:
    """One ledger line: the entry, the slot and who sent it (LeaderScheduler's header), or
    for a scheduler that names no slot (RedBeat) the time beat sent it."""
    slot = scheduled_slot(task.request)
    headers = task.request.headers or {}
    line = {
        "entry": name,
        "task_id": task.request.id,
        "received": time.time(),
        "slot": int(slot.scheduled.timestamp() * 1000) if slot else None,
        "replica": slot.replica if slot else None,
        "sender": headers.get("csl_sender") or getattr(task.request, "csl_sender", None),
        "published": headers.get("csl_published") or getattr(task.request, "csl_published", None),
        "fence": slot.fencing_token if slot else None,
        "caught_up": slot.caught_up if slot else False,
        "sent_at": slot.sent_at if slot else None,
    }
    ledger().rpush("ledger", json.dumps(line, sort_keys=True))


@app.task(name="beatproj.record", bind=True)
def record(self: Task[Any, Any], name: str) -> None:
    _write(self, name)


if os.environ.get("CSL_BEAT_ROLE") == "worker":

    @app.task(name="beatproj.unregistered", bind=True)
    def unregistered(self: Task[Any, Any], name: str) -> None:
        _write(self, name)


@signals.before_task_publish.connect
def _stamp(headers: dict[str, Any] | None = None, **_: Any) -> None:
    """Every message says which process published it, and when (for RedBeat, whose
    messages carry no slot)."""
    if headers is not None:
        headers["csl_sender"] = f"{socket.gethostname()}:{os.getpid()}"
        headers["csl_published"] = time.time()
