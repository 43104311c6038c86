"""The Celery project of tests/worker/test_stack.py: exports limited to one per report,
two (weighted) per tenant and five in all, as ``lock_limits`` stacks them. Every body
records, in the data Redis and in one step each, how much weight is inside per tenant and
in all, and the highest it ever saw, so the test can prove the limits held."""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery

from celery_singleton_lock import LockedTask

BROKER = os.environ.get("CSL_BROKER_URL", "redis://127.0.0.1:6379/0")

app = Celery("stack_proj", broker=BROKER, backend=os.environ.get("CSL_BACKEND_URL"))
app.conf.update(
    task_default_queue="csl-stack",
    worker_prefetch_multiplier=1,
    task_acks_late=True,
    broker_connection_retry_on_startup=True,
    result_expires=600,
    result_backend_transport_options={"retry_policy": {"max_retries": 2, "interval_max": 0.2}},
)


def _task(**options: Any) -> Any:
    """This app's own task (not shared: other apps in the same test process, such as the
    in-process test worker's, must not get these tasks)."""
    return app.task(shared=False, **options)


#: The numbers the code gives the limits (the tests lower them in Redis).
PER_TENANT = 2
IN_ALL = 5

_data: redis.Redis | None = None
_data_pid = 0

# Enter: add the weight to the tenant's and the global count, and raise the peaks; one
# script, so a concurrent body never reads a half-made update.
_ENTER = """
local t = redis.call('INCRBY', KEYS[1], ARGV[1])
local g = redis.call('INCRBY', KEYS[2], ARGV[1])
local r = redis.call('INCR', KEYS[5])
if tonumber(redis.call('GET', KEYS[3]) or 0) < t then redis.call('SET', KEYS[3], t) end
if tonumber(redis.call('GET', KEYS[4]) or 0) < g then redis.call('SET', KEYS[4], g) end
if r > 1 then redis.call('INCR', 'report-overlap') end
return {t, g}
"""


def data() -> redis.Redis:
    """A client of the data Redis for this process (recreated after fork)."""
    global _data, _data_pid  # noqa: PLW0603 - one lazily built client per process
    if _data is None or _data_pid != os.getpid():
        _data = redis.Redis.from_url(BROKER)
        _data_pid = os.getpid()
    return _data


def _section(report: str, tenant: str, weight: int, seconds: float) -> str:
    r = data()
    keys = [f"in:{tenant}", "in:all", f"peak:{tenant}", "peak:all", f"in-report:{report}"]
    r.eval(_ENTER, len(keys), *keys, weight)
    r.rpush(f"pids:{tenant}", os.getpid())
    time.sleep(seconds)
    with r.pipeline(transaction=True) as leave:
        leave.decrby(f"in:{tenant}", weight)
        leave.decrby("in:all", weight)
        leave.decr(f"in-report:{report}")
        leave.incr("done")
        leave.execute()
    return "ran"


def _size_weight(report: str, tenant: str, size: int = 1, seconds: float = 0.0) -> int:
    """A big export counts double."""
    del report, tenant, seconds
    return 2 if size > 100 else 1


@_task(base=LockedTask, lock_keys=["report"], lock_on_conflict="wait", lock_wait=600,
          lock_timeout=3, lock_limits=[("tenant:{tenant}", PER_TENANT), ("global:exports", IN_ALL)],
          lock_weight=_size_weight)  # fmt: skip
def export(report: str, tenant: str, size: int = 1, seconds: float = 0.0) -> str:
    """One export: at most one per report, PER_TENANT weight per tenant, IN_ALL in all."""
    return _section(report, tenant, _size_weight(report, tenant, size), seconds)


@_task(base=LockedTask, lock_keys=["report"], lock_on_conflict="skip", lock_timeout=3,
          lock_limits=[("tenant:{tenant}", PER_TENANT), ("global:exports", IN_ALL)])  # fmt: skip
def export_or_skip(report: str, tenant: str, seconds: float = 0.0) -> str:
    """As export, weight 1, skipped when a limit is full."""
    return _section(report, tenant, 1, seconds)


@_task(base=LockedTask, lock_keys=["report"], lock_on_conflict="raise", lock_timeout=3,
          lock_limits=[("tenant:{tenant}", PER_TENANT), ("global:exports", IN_ALL)],
          lock_weight=_size_weight)  # fmt: skip
def export_or_raise(report: str, tenant: str, size: int = 1, seconds: float = 0.0) -> str:
    """As export, failing with TaskLocked when its key is held or a limit is full."""
    return _section(report, tenant, _size_weight(report, tenant, size), seconds)


@_task(base=LockedTask, lock_keys=["report"], lock_scope="queue", lock_timeout=3,
          lock_limits=[("tenant:{tenant}", PER_TENANT), ("global:exports", IN_ALL)])  # fmt: skip
def export_queued(report: str, tenant: str, seconds: float = 0.0) -> str:
    """Queue scope (skip): a duplicate call while one is queued or running publishes
    nothing; the accepted call waits for room in its limits."""
    return _section(report, tenant, 1, seconds)


@_task(base=LockedTask, lock_keys=["report"], lock_scope="queue", lock_on_conflict="raise",
          lock_timeout=3,
          lock_limits=[("tenant:{tenant}", PER_TENANT), ("global:exports", IN_ALL)])  # fmt: skip
def export_queued_or_raise(report: str, tenant: str, seconds: float = 0.0) -> str:
    """Queue scope (raise): a run held back by a limit fails, giving its hold up."""
    return _section(report, tenant, 1, seconds)


@_task(base=LockedTask, lock_keys=["report"], lock_scope="queue", lock_on_conflict="coalesce",
          lock_timeout=3, lock_retry_delay=0.3,
          lock_limits=[("tenant:{tenant}", PER_TENANT), ("global:exports", IN_ALL)])  # fmt: skip
def export_latest(report: str, tenant: str, value: int, seconds: float = 0.0) -> int:
    """Keep latest: calls made while one is queued or running become one follow-up (the
    latest arguments win), which takes its shares when it runs."""
    data().rpush(f"values:{report}", value)
    _section(report, tenant, 1, seconds)
    return value


@_task(base=LockedTask, lock_keys=["report"], lock_scope="queue", lock_on_conflict="replace",
          lock_replace_running=True, lock_timeout=3, lock_retry_delay=0.3,
          lock_limits=[("tenant:{tenant}", PER_TENANT), ("global:exports", IN_ALL)])  # fmt: skip
def export_replacing(report: str, tenant: str, value: int, seconds: float = 0.0) -> int:
    """Replace: a new call supersedes a queued one, and revokes a running one (terminate),
    taking the key (and its own shares) once that run has stopped."""
    data().rpush(f"values:{report}", value)
    _section(report, tenant, 1, seconds)
    return value


@_task(base=LockedTask, lock_keys=["report"], lock_on_conflict="park", lock_timeout=3,
          lock_limits=[("tenant:{tenant}", PER_TENANT), ("global:exports", IN_ALL)],
          lock_weight=_size_weight)  # fmt: skip
def export_parked(report: str, tenant: str, size: int = 1, seconds: float = 0.0) -> str:
    """Park: a run whose key is held, or whose limits have no room, waits in the lock Redis
    (PARKED), holding no worker and no share."""
    data().rpush(f"order:{tenant}", report)
    return _section(report, tenant, _size_weight(report, tenant, size), seconds)


def weight_of(*args: Any, **kwargs: Any) -> int:
    """The weight export gives a call (for the tests)."""
    return _size_weight(*args, **kwargs)


def _given_weight(report: str, tenant: str, weight: int = 1, seconds: float = 0.0) -> int:
    """The weight the call names."""
    del report, tenant, seconds
    return weight


@_task(base=LockedTask, lock_keys=["report"], lock_on_conflict="wait", lock_wait=600,
          lock_timeout=3, lock_limits=[("tenant:{tenant}", PER_TENANT), ("global:exports", IN_ALL)],
          lock_weight=_given_weight)  # fmt: skip
def export_weighing(report: str, tenant: str, weight: int = 1) -> str:
    """Wait (up to 600 s) for room for the weight the call names."""
    return _section(report, tenant, weight, 0.0)


@_task(base=LockedTask, lock_keys=["report"], lock_on_conflict="park", lock_timeout=3,
          lock_limits=[("tenant:{tenant}", PER_TENANT), ("global:exports", IN_ALL)],
          lock_weight=_given_weight)  # fmt: skip
def export_weighing_parked(report: str, tenant: str, weight: int = 1, seconds: float = 0.0) -> str:
    """Park until there is room for the weight the call names."""
    return _section(report, tenant, weight, seconds)


@_task(base=LockedTask, lock_keys=["report"], lock_scope="queue", lock_on_conflict="raise",
          lock_timeout=3,
          lock_limits=[("tenant:{tenant}", PER_TENANT), ("global:exports", IN_ALL)],
          lock_weight=_given_weight)  # fmt: skip
def export_weighing_queued(report: str, tenant: str, weight: int = 1) -> str:
    """Queue scope: the call holds its key from publish; its weight is taken at its run."""
    return _section(report, tenant, weight, 0.0)
