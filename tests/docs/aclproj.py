"""A Celery project whose locks live behind the least-privilege ACL user of
docs/deployment.md: one task per conflict policy and mode.

``CSL_ACL_LOCK_URL`` is the lock Redis as that user; ``CSL_ACL_BROKER_URL`` the broker (the
server's default user, another database), whose database + 1 keeps the results and + 2 the
tasks' own records. ``CSL_ACL_SCRIPTING=0`` selects the plain-command protocol, with only the
tasks that mode allows. Each body records its value (and how many runs of its name are
inside at once) in the data database, sleeps ``seconds`` (or, negative, waits for the test
to open its gate) and returns ``value``; the ``lock_on_lost="raise"`` task checks its lease
meanwhile.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery

from celery_singleton_lock import LockedTask

BROKER = os.environ.get("CSL_ACL_BROKER_URL", "redis://127.0.0.1:6399/1")
SCRIPTING = os.environ.get("CSL_ACL_SCRIPTING", "1") != "0"


def _database(offset: int) -> str:
    base, _, number = BROKER.rpartition("/")
    return f"{base}/{int(number) + offset}"


app = Celery("aclproj", broker=BROKER, backend=_database(1))
app.conf.update(
    singleton_lock_url=os.environ.get("CSL_ACL_LOCK_URL"),
    singleton_lock_scripting=SCRIPTING,
    task_default_queue=os.environ.get("CSL_ACL_QUEUE", "acl"),
    worker_prefetch_multiplier=1,
    result_expires=600,
    broker_connection_retry_on_startup=True,
)

_data: dict[int, redis.Redis] = {}


def data() -> redis.Redis:
    """The records' Redis client of this process."""
    pid = os.getpid()
    if pid not in _data:
        _data[pid] = redis.Redis.from_url(_database(2), decode_responses=True)
    return _data[pid]


#: Count a run in and raise the peak of runs inside at once, atomically.
_ENTER = """
local inside = redis.call('INCR', KEYS[1])
if inside > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], inside) end
return inside
"""

#: How long a gated body waits for its gate at most (seconds).
GATE_BOUND = 120.0


def record(name: str, seconds: float, value: int) -> int:
    """The body of every task: note the run, and the most runs of ``name`` inside at once.
    It then sleeps ``seconds``, or, when ``seconds`` is negative, holds until the test
    opens the gate of ``name`` (``open:<name>`` in the data database; at most
    :data:`GATE_BOUND`), so a run is still inside when the test acts, however slow the
    machine."""
    client = data()
    # One step: two runs reading and raising the peak apart could leave the lower one.
    client.eval(_ENTER, 2, f"inside:{name}", f"peak:{name}")
    client.rpush(f"runs:{name}", value)
    if seconds >= 0:
        time.sleep(seconds)
    else:
        deadline = time.monotonic() + GATE_BOUND
        while not client.get(f"open:{name}") and time.monotonic() < deadline:
            time.sleep(0.05)
    client.decr(f"inside:{name}")
    return value


def _task(**options: Any) -> Any:
    options.setdefault("lock_keys", ["name"])
    return app.task(base=LockedTask, shared=False, **options)


@_task(name="acl.skip")
def skip(name: str, seconds: float, value: int) -> int:
    return record(name, seconds, value)


@_task(name="acl.wait", lock_on_conflict="wait")
def wait(name: str, seconds: float, value: int) -> int:
    return record(name, seconds, value)


@_task(name="acl.retry", lock_on_conflict="retry", lock_retry_delay=0.2, max_retries=None)
def retry(name: str, seconds: float, value: int) -> int:
    return record(name, seconds, value)


@_task(name="acl.raise", lock_on_conflict="raise")
def raise_(name: str, seconds: float, value: int) -> int:
    return record(name, seconds, value)


@_task(name="acl.queued", lock_scope="queue")
def queued(name: str, seconds: float, value: int) -> int:
    return record(name, seconds, value)


@_task(name="acl.release_start", lock_scope="queue", lock_release="start")
def release_start(name: str, seconds: float, value: int) -> int:
    return record(name, seconds, value)


@_task(name="acl.lost", lock_on_lost="raise", lock_timeout=1.0)
def lost(name: str, seconds: float, value: int) -> int:
    """Records the run, then checks every 50 ms for ``seconds`` that it still holds its
    lease: ``LockLost`` (raised here or by the worker) once the lease is gone."""
    from celery_singleton_lock import current_lock  # noqa: PLC0415

    record(name, 0, value)
    lock = current_lock()
    assert lock is not None
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        lock.ensure_held()
        time.sleep(0.05)
    return value


if SCRIPTING:  # the modes below are Lua scripts: a plain-command worker refuses them

    @_task(name="acl.coalesce", lock_scope="queue", lock_on_conflict="coalesce")
    def coalesce(name: str, seconds: float, value: int) -> int:
        return record(name, seconds, value)

    @_task(name="acl.replace", lock_scope="queue", lock_on_conflict="replace")
    def replace(name: str, seconds: float, value: int) -> int:
        return record(name, seconds, value)

    @_task(name="acl.slots", lock_limit=2, lock_on_conflict="wait")
    def slots(name: str, seconds: float, value: int) -> int:
        return record(name, seconds, value)

    @_task(name="acl.debounce", lock_debounce=5)
    def debounce(name: str, seconds: float, value: int) -> int:
        return record(name, seconds, value)

    @_task(name="acl.throttle", lock_rate_limit="1/m")
    def throttle(name: str, seconds: float, value: int) -> int:
        return record(name, seconds, value)

    @_task(name="acl.success", lock_release="success", lock_hold=30)
    def success(name: str, seconds: float, value: int) -> int:
        return record(name, seconds, value)

    @_task(name="acl.park", lock_on_conflict="park")
    def park(name: str, seconds: float, value: int) -> int:
        return record(name, seconds, value)

    @_task(name="acl.ordered", lock_on_conflict="park", lock_order="enqueue")
    def ordered(name: str, seconds: float, value: int) -> int:
        return record(name, seconds, value)

    @_task(
        name="acl.stacked", lock_keys=["name", "value"], lock_limits=[("acl:{name}", 2)],
        lock_weight=1, lock_on_conflict="wait",
    )  # fmt: skip
    def stacked(name: str, seconds: float, value: int) -> int:
        """Each value its own key; at most 2 runs of one ``name`` at once (a stacked limit)."""
        return record(name, seconds, value)
