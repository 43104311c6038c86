"""The Celery project of tests/worker/test_held.py: park tasks held back by a stacked limit or
by their rate, on a broker whose visibility timeout is an hour (kombu's default, set here
explicitly), so a call that only a broker redelivery could bring back does not come back
within any test's bound. Every body records its run (call name, pid) in the data Redis."""

from __future__ import annotations

import os
import time

import redis
from celery import Celery

from celery_singleton_lock import LockedTask

BROKER = os.environ.get("CSL_BROKER_URL", "redis://127.0.0.1:6379/0")
#: The broker's visibility timeout (seconds): far beyond every wait of the tests.
VISIBILITY_TIMEOUT = 3600

app = Celery("held_proj", broker=BROKER, backend=os.environ.get("CSL_BACKEND_URL"))
app.conf.update(
    task_default_queue="csl-held",
    worker_prefetch_multiplier=1,
    task_acks_late=True,
    broker_transport_options={"visibility_timeout": VISIBILITY_TIMEOUT},
    broker_connection_retry_on_startup=True,
    result_expires=600,
    result_backend_transport_options={"retry_policy": {"max_retries": 2, "interval_max": 0.2}},
)

#: The number of the ``pool:{pool}`` limit.
POOL = 4
#: The lease of every task (seconds): a killed holder's shares end this long after its death.
LEASE = 3.0

_data: redis.Redis | None = None
_data_pid = 0


def data() -> redis.Redis:
    """A client of the data Redis for this process (recreated after fork)."""
    global _data, _data_pid  # noqa: PLW0603 - one lazily built client per process
    if _data is None or _data_pid != os.getpid():
        _data = redis.Redis.from_url(BROKER)
        _data_pid = os.getpid()
    return _data


#: The longest a body waits to be told to end (seconds).
LONGEST = 120.0


def record(name: str, seconds: float) -> str:
    """Record a run of ``name`` (its pid, and when it began by the server's clock), then
    last ``seconds``; a negative ``seconds``: until the test sets ``stop:<name>`` (at most
    ``LONGEST``)."""
    r = data()
    seconds_now, micros = r.time()
    r.rpush(f"at:{name}", seconds_now * 1000 + micros // 1000)  # the server's clock (ms)
    r.rpush(f"ran:{name}", os.getpid())
    if seconds >= 0:
        time.sleep(seconds)
        return "ran"
    deadline = time.monotonic() + LONGEST
    while not r.exists(f"stop:{name}") and time.monotonic() < deadline:
        time.sleep(0.05)
    return "ran"


def given_weight(name: str, pool: str, weight: int = 1, seconds: float = 0.0) -> int:
    """The weight a call asks for."""
    del name, pool, seconds
    return weight


@app.task(base=LockedTask, lock_keys=["name"], lock_on_conflict="park", lock_timeout=LEASE,
          lock_limits=[("pool:{pool}", POOL)], lock_weight=given_weight)  # fmt: skip
def pooled(name: str, pool: str, weight: int = 1, seconds: float = 0.0) -> str:
    """Park, in a limit of POOL shared by every call of one ``pool``."""
    return record(name, seconds)


@app.task(base=LockedTask, lock_keys=["name"], lock_scope="queue", lock_timeout=LEASE,
          lock_limits=[("pool:{pool}", POOL)], lock_weight=given_weight)  # fmt: skip
def pooled_queued(name: str, pool: str, weight: int = 1, seconds: float = 0.0) -> str:
    """Queue scope (skip) in the same limit: an accepted call held back by the limit comes
    back with its hold."""
    return record(name, seconds)


@app.task(base=LockedTask, lock_keys=["name"], lock_on_conflict="park", lock_timeout=LEASE,
          lock_rate_limit="1/s")  # fmt: skip
def paced(name: str, seconds: float = 0.0) -> str:
    """Park, at most one start a second per name."""
    return record(name, seconds)
