"""The Celery project of tests/worker/test_keep_every_call.py: the modes tried as a user
would, with busy workers, countdowns, killed processes. Every body records what it ran (its
arguments, when, in which process) in the data Redis; the test reads it back."""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery

from celery_singleton_lock import LockedTask
from celery_singleton_lock.modes.throttle import starts_key

BROKER = os.environ.get("CSL_BROKER_URL", "redis://127.0.0.1:6379/0")

app = Celery("keep_proj", broker=BROKER, backend=os.environ.get("CSL_BACKEND_URL"))
app.conf.update(
    task_default_queue="csl-keep",
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    result_expires=600,
    result_backend_transport_options={"retry_policy": {"max_retries": 2, "interval_max": 0.2}},
)

_data: redis.Redis | None = None
_data_pid = 0


def data() -> redis.Redis:
    """A client of the data Redis for this process (recreated after fork)."""
    global _data, _data_pid  # noqa: PLW0603 - one lazily built client per process
    if _data is None or _data_pid != os.getpid():
        _data = redis.Redis.from_url(BROKER)
        _data_pid = os.getpid()
    return _data


def record(name: str, value: Any, seconds: float = 0.0) -> Any:
    """Record a run of ``name`` with ``value`` (and any overlap), lasting ``seconds``."""
    r = data()
    inside = r.incr(f"inside:{name}")
    r.rpush(f"inside-seen:{name}", inside)
    if inside > 1:
        r.incr(f"over:{name}")
    r.rpush(f"runs:{name}", f"{value} {time.time():.3f} {os.getpid()}")
    time.sleep(seconds)
    r.decr(f"inside:{name}")
    return value


def admitted(task: Any, name: str, *args: Any) -> None:
    """Copy this run's admission by ``lock_rate_limit`` from the starts set (a member
    ``<task id>:<s>.<us>`` scored in server ms) to the hash ``admitted-at:<name>``: the tests
    judge the rate on the server's clock, not on when the bodies got to their ledger."""
    r = data()
    mine = f"{task.request.id}:".encode()
    for member, score in r.zrange(starts_key(task.lock_key(name, *args)), 0, -1, withscores=True):
        if member.startswith(mine):
            r.hset(f"admitted-at:{name}", member, int(score))


@app.task
def busy(seconds: float) -> str:
    """Keeps a pool process busy (not locked)."""
    time.sleep(seconds)
    return "busy"


@app.task(base=LockedTask, lock_keys=["name"], lock_scope="queue", lock_on_conflict="replace")
def replaced(name: str, value: int) -> int:
    """Replace: a new call supersedes a queued one."""
    return record(name, value)  # type: ignore[no-any-return]


@app.task(base=LockedTask, lock_keys=["name"], lock_scope="queue", lock_on_conflict="coalesce")
def coalesced(name: str, value: int, seconds: float = 0.0) -> int:
    """Keep latest."""
    return record(name, value, seconds)  # type: ignore[no-any-return]


@app.task(base=LockedTask, lock_keys=["name"], lock_debounce=0.3)
def burst(name: str, value: int, seconds: float = 0.0) -> int:
    """Debounced, skip on a busy key (the default)."""
    return record(name, value, seconds)  # type: ignore[no-any-return]


@app.task(base=LockedTask, lock_keys=["name"], lock_debounce=0.3, lock_on_conflict="retry",
          lock_retry_delay=0.3, max_retries=None)  # fmt: skip
def burst_retry(name: str, value: int, seconds: float = 0.0) -> int:
    """Debounced, retry on a busy key."""
    return record(name, value, seconds)  # type: ignore[no-any-return]


@app.task(base=LockedTask, lock_keys=["name"], lock_debounce=0.3, acks_late=True,
          reject_on_worker_lost=True, lock_timeout=30.0)  # fmt: skip
def burst_killed(name: str, value: int) -> int:
    """Debounced, acks_late + reject_on_worker_lost: the first run waits to be killed."""
    r = data()
    if r.incr(f"attempts:{name}") == 1:
        r.rpush(f"pids:{name}", os.getpid())
        time.sleep(30)
    return record(name, value)  # type: ignore[no-any-return]


@app.task(base=LockedTask, bind=True, lock_keys=["name"], lock_debounce=0.3, max_retries=3)
def burst_retrying(self: Any, name: str, value: int) -> int:
    """Debounced: its first attempt asks for a retry in 2 s."""
    r = data()
    r.rpush(f"attempts:{name}", f"{time.time():.3f}")
    if r.llen(f"attempts:{name}") == 1:
        raise self.retry(countdown=2.0)
    return record(name, value)  # type: ignore[no-any-return]


@app.task(base=LockedTask, lock_keys=["name"], lock_scope="queue", lock_on_conflict="coalesce",
          lock_rate_limit="1/s")  # fmt: skip
def follow_throttled(name: str, value: int, seconds: float = 0.0) -> int:
    """Keep latest, at most one start a second."""
    admitted(follow_throttled, name, value, seconds)
    return record(name, value, seconds)  # type: ignore[no-any-return]


@app.task(base=LockedTask, lock_keys=["name"], lock_limit=2, lock_release="success",
          lock_hold=4.0, lock_on_conflict="skip")  # fmt: skip
def held_slots(name: str, value: int, seconds: float = 0.0) -> int:
    """Two slots; a success keeps its slot 4 s more."""
    return record(name, value, seconds)  # type: ignore[no-any-return]


@app.task(base=LockedTask, lock_keys=["name"], lock_on_conflict="retry", lock_rate_limit="4/s",
          max_retries=None)  # fmt: skip
def paced(name: str, index: int) -> int:
    """One at a time, at most 4 starts a second, retrying when busy or throttled."""
    admitted(paced, name, index)
    return record(name, index, 0.02)  # type: ignore[no-any-return]


@app.task(base=LockedTask, lock_keys=["name"], lock_scope="queue")
def queued_job(name: str, value: int = 0) -> int:
    """Queue scope: a duplicate call while one is queued or running publishes nothing."""
    return record(name, value)  # type: ignore[no-any-return]


@app.task
def after(value: Any) -> str:
    """What a canvas runs next."""
    data().rpush("after", str(value))
    return "after"


@app.task(base=LockedTask, lock_keys=["name"], lock_timeout=30.0)
def plain_job(name: str, value: int = 0) -> int:
    """Run scope, skip."""
    return record(name, value)  # type: ignore[no-any-return]


@app.task(base=LockedTask, lock_timeout=30.0)
def killable(name: str, seconds: float) -> str:
    """Run scope keyed on every argument by default; records its pid, then sleeps."""
    data().rpush(f"pids:{name}", os.getpid())
    time.sleep(seconds)
    return "ran"


@app.task(base=LockedTask, bind=True, lock_keys=["name"], lock_scope="queue", lock_renew=False,
          lock_timeout=1.0, max_retries=2)  # fmt: skip
def outlives_its_lease(self: Any, name: str) -> str:
    """Queue scope, no renewal: the first attempt outlives its 1 s lease, then retries."""
    r = data()
    if r.incr(f"attempts:{name}") == 1:
        time.sleep(2.0)
        raise self.retry(countdown=0.2)
    return "second"


@app.task(base=LockedTask, lock_keys=["name"], lock_on_conflict="park", lock_timeout=5.0)
def parked_job(name: str, value: int, seconds: float = 0.0) -> int:
    """Run scope: a run whose key is held parks; it runs when the key frees."""
    return record(name, value, seconds)  # type: ignore[no-any-return]


@app.task(base=LockedTask, lock_keys=["name"], lock_scope="queue", lock_on_conflict="park")
def parked_queued(name: str, value: int, seconds: float = 0.0) -> int:
    """Queue scope: a call whose key is held parks at publish."""
    return record(name, value, seconds)  # type: ignore[no-any-return]


@app.task(base=LockedTask, lock_keys=["name"], lock_on_conflict="park", lock_timeout=3.0,
          lock_limit=2)  # fmt: skip
def parked_pair(name: str, value: int, seconds: float = 0.0) -> int:
    """Two at a time; the rest park."""
    return record(name, value, seconds)  # type: ignore[no-any-return]


@app.task(base=LockedTask, lock_keys=["name"], lock_on_conflict="park", lock_rate_limit="2/s")
def parked_paced(name: str, value: int) -> int:
    """At most two starts a second; a throttled run parks until its window frees."""
    admitted(parked_paced, name, value)
    return record(name, value)  # type: ignore[no-any-return]


@app.task(base=LockedTask, lock_keys=["name"], lock_on_conflict="park", lock_timeout=3.0,
          acks_late=True)  # fmt: skip
def parked_late(name: str, value: int, seconds: float = 0.0) -> int:
    """Park, acks_late: a busy single-process worker reserves no second message."""
    return record(name, value, seconds)  # type: ignore[no-any-return]


@app.task(base=LockedTask, lock_keys=["name"], lock_on_conflict="park", lock_order="enqueue",
          lock_timeout=3.0)  # fmt: skip
def ordered_job(name: str, value: int, seconds: float = 0.0) -> int:
    """Park, and the calls of a key run in the order they were made."""
    return record(name, value, seconds)  # type: ignore[no-any-return]


_FENCED_WRITE = """
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) < current then
  redis.call('RPUSH', KEYS[3], ARGV[2])
  return 0
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('RPUSH', KEYS[2], ARGV[2])
return 1
"""


@app.task(base=LockedTask, lock_keys=["name"], lock_timeout=2.0, lock_on_lost="raise",
          lock_on_conflict="wait", lock_wait=60)  # fmt: skip
def fenced_writer(name: str, who: str, steps: int) -> str:
    """Writes ``who`` to a fenced resource (refusing a token older than the last write it
    took) every 0.1 s, ``steps`` times, under its lock."""
    from celery_singleton_lock import current_lock  # noqa: PLC0415

    lock = current_lock()
    assert lock is not None
    r = data()
    r.rpush(f"pid:{name}", f"{who} {os.getpid()}")
    keys = (f"fence:{name}", f"accepted:{name}", f"refused:{name}")
    for _ in range(steps):
        time.sleep(0.1)
        r.eval(_FENCED_WRITE, 3, *keys, lock.fencing_token, who)
    return who


@app.task(base=LockedTask, lock_keys=["name"], lock_scope="queue")
def queued_once(name: str, value: int) -> int:
    """Queue scope: a task id runs once."""
    return record(name, value)  # type: ignore[no-any-return]


@app.task(base=LockedTask, lock_keys=["name"], lock_timeout=2.0, lock_on_lost="raise")
def lost_key_recorder(name: str) -> str:
    """Waits (up to 60 s) for its lease to be taken away; records the lock name that the
    ``LockLost`` raised in its body carries."""
    from celery_singleton_lock import LockLost, current_lock  # noqa: PLC0415

    lock = current_lock()
    assert lock is not None
    r = data()
    r.rpush(f"started:{name}", lock.name)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.05)
    except LockLost as exc:
        r.rpush(f"caught:{name}", repr(exc.name))
        return "lost"
    return "never lost"
