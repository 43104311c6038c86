"""``lock_rate_limit`` on real prefork workers and a real redis-server: the sliding window
holds across workers (a ledger of start times checked for every window), and each policy
applies to a throttled run, visibly (signal, worker event, metric, skip record)."""

from __future__ import annotations

import itertools
import time
import urllib.request
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
import redis
from celery import Celery

from celery_singleton_lock import LockedTask, RedisLock, TaskLocked, TaskThrottled, skip_info
from celery_singleton_lock.config import clear_settings
from celery_singleton_lock.modes.throttle import next_start, starts_key
from celery_singleton_lock.signals import lock_throttled
from celery_singleton_lock.testing import CeleryWorker
from tests.modes.conftest import ledger, recorded, wait_signal
from tests.observe.test_skip import EventCapture
from tests.worker.conftest import wait_for

pytestmark = pytest.mark.slow

#: Start times are written by the bodies, a few milliseconds after the server admitted
#: them, and those delays vary with load: windows are checked this much shorter.
SLACK = 0.2


def _starts(data: redis.Redis, name: str) -> list[float]:
    return sorted(entry["at"] for entry in ledger(data, name))


def _crowded_windows(starts: list[float], limit: int, window: float) -> list[list[float]]:
    """Every run of ``limit + 1`` consecutive starts that fits in less than ``window -
    SLACK`` seconds (empty when the rate held in every sliding window)."""
    return [
        starts[i : i + limit + 1]
        for i in range(len(starts) - limit)
        if starts[i + limit] - starts[i] < window - SLACK
    ]


def test_throttle_holds_across_three_workers(
    modesproj: ModuleType,
    modes_worker: CeleryWorker,
    more_workers: Callable[[int], list[CeleryWorker]],
    data: redis.Redis,
    name: str,
) -> None:
    """Fifteen calls of one key under lock_rate_limit="3/s" on three prefork workers: no
    window of one second holds more than three starts, every call runs exactly once, the
    runs take the four seconds the rate demands, and another key keeps its own rate."""
    more_workers(2)
    other = name + "-other"
    calls = [modesproj.rate_retry.delay(name, n) for n in range(15)]
    others = [modesproj.rate_retry.delay(other, n) for n in range(3)]
    assert wait_for(lambda: all(r.ready() for r in calls + others), timeout=60)
    assert sorted(r.get(timeout=1) for r in calls) == list(range(15))
    starts = _starts(data, name)
    assert len(starts) == 15
    assert _crowded_windows(starts, 3, 1.0) == []
    assert starts[-1] - starts[0] >= 4.0 - SLACK  # 15 starts at 3/s: five windows at least
    workers = {entry["worker"] for entry in ledger(data, name)}
    assert len(workers) >= 2, workers  # the one key's starts came from several workers
    assert data.get(f"overlaps:{name}") is None  # and the lock kept them apart
    other_starts = _starts(data, other)
    assert len(other_starts) == 3
    assert other_starts[-1] - other_starts[0] < 1.0  # its three fit in one window
    key = modesproj.rate_retry.lock_key(name, 0)
    assert 0 < data.pttl(starts_key(key)) <= 2000  # the window set expires by itself
    assert data.get(key) is None  # nothing holds the key afterwards


def test_throttled_skip_is_signalled_evented_counted_and_recorded(
    modesproj: ModuleType,
    modes_worker: CeleryWorker,
    data: redis.Redis,
    name: str,
    metrics_port: int,
) -> None:
    """A call over lock_rate_limit="1/m" under "skip" does not run, frees the key at once,
    and is visible: lock_throttled (policy skip, rate, retry_in), the task-lock-throttled
    worker event, the throttled metric and skip_info with reason "throttled"."""
    key = modesproj.rate_skip.lock_key(name)
    assert modesproj.rate_skip.delay(name).get(timeout=15) == "ran"
    with EventCapture(modesproj.app, "task-lock-throttled") as capture:
        second = modesproj.rate_skip.delay(name)
        assert second.get(timeout=15) is None
        assert capture.done.wait(15)
    (event,) = capture.events
    assert (event["uuid"], event["key"], event["policy"], event["rate"]) == (
        second.id, key, "skip", "1/m",
    )  # fmt: skip
    assert 50 < event["retry_in"] <= 60
    signal = wait_signal(data, key, "lock_throttled")
    assert (signal["task_id"], signal["policy"], signal["scope"], signal["rate"]) == (
        second.id, "skip", "run", "1/m",
    )  # fmt: skip
    assert not recorded(data, key, "lock_conflict")
    assert len(recorded(data, key, "lock_acquired")) == 1  # the throttled run acquired nothing
    skip = skip_info(second)
    assert skip is not None
    assert (skip.reason, skip.holder_task_id, skip.key) == ("throttled", None, key)
    assert len(ledger(data, name)) == 1
    assert data.get(key) is None  # a throttled run never keeps the key
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as page:
        text = page.read().decode()
    assert 'celery_singleton_lock_throttled_total{policy="skip",task="modes.rate_skip"} 1.0' in text


def test_throttled_wait_starts_at_the_next_free_start(
    modesproj: ModuleType, modes_worker: CeleryWorker, data: redis.Redis, name: str
) -> None:
    """Under "wait" a call over lock_rate_limit="1/s" starts one second after the first
    start, never sooner; when the next free start lies beyond lock_wait (a per-call
    "1/m" with lock_wait=0.5) the call fails with TaskThrottled at once."""
    key = modesproj.rate_wait.lock_key(name)
    assert modesproj.rate_wait.delay(name).get(timeout=15) == "ran"
    assert modesproj.rate_wait.delay(name).get(timeout=15) == "ran"
    first, second = _starts(data, name)
    assert 1.0 - SLACK <= second - first < 2.0
    assert wait_signal(data, key, "lock_throttled")["policy"] == "wait"

    slow = name + "-slow"
    options: dict[str, Any] = {"lock_rate_limit": "1/m", "lock_wait": 0.5}
    assert modesproj.rate_wait.apply_async((slow,), **options).get(timeout=15) == "ran"
    started = time.monotonic()
    late = modesproj.rate_wait.apply_async((slow,), **options)
    with pytest.raises(TaskThrottled) as caught:
        late.get(timeout=15)
    assert time.monotonic() - started < 5
    assert caught.value.retry_in is not None
    assert caught.value.retry_in > 50
    assert len(ledger(data, slow)) == 1


def test_throttled_raise_fails_with_task_throttled(
    modesproj: ModuleType, modes_worker: CeleryWorker, data: redis.Redis, name: str
) -> None:
    """Under "raise" a call over lock_rate_limit="1/m" fails with TaskThrottled (a
    TaskLocked) naming the key and the seconds to the next free start."""
    key = modesproj.rate_raise.lock_key(name)
    assert modesproj.rate_raise.delay(name).get(timeout=15) == "ran"
    second = modesproj.rate_raise.delay(name)
    with pytest.raises(TaskLocked) as caught:
        second.get(timeout=15)
    assert isinstance(caught.value, TaskThrottled)
    assert caught.value.key == key
    assert caught.value.retry_in is not None
    assert 50 < caught.value.retry_in <= 60
    assert wait_signal(data, key, "lock_throttled")["policy"] == "raise"
    assert len(ledger(data, name)) == 1


def test_queue_scope_throttles_starts_and_keeps_the_key_for_the_retry(
    modesproj: ModuleType, modes_worker: CeleryWorker, data: redis.Redis, name: str
) -> None:
    """In queue scope a message over lock_rate_limit="1/s" does not start: it retries at
    the next free start with its key handed back to it, so a duplicate published while it
    waits gets its id; it starts a second after the first start."""
    key = modesproj.rate_queue.lock_key(name)
    first = modesproj.rate_queue.delay(name)
    assert first.get(timeout=15) == first.id
    second = modesproj.rate_queue.delay(name)
    assert second.id != first.id  # the first run ended: a new message
    throttled = wait_signal(data, key, "lock_throttled")
    assert (throttled["task_id"], throttled["policy"]) == (second.id, "retry")
    duplicate = modesproj.rate_queue.delay(name)
    assert duplicate.id == second.id  # the retried message still holds the key
    assert second.get(timeout=15) == second.id
    starts = _starts(data, name)
    assert len(starts) == 2
    assert starts[1] - starts[0] >= 1.0 - SLACK


def _at_server_phase(client: redis.Redis, phase_ms: int, window_ms: int) -> None:
    """Sleep until the server clock is ``phase_ms`` into a window of ``window_ms``."""
    seconds, micros = client.time()
    now = int(seconds) * 1000 + int(micros) // 1000
    time.sleep(((phase_ms - now) % window_ms) / 1000)


def test_the_window_slides_on_the_server_clock(modes_redis: Any, name: str) -> None:
    """Two starts late in one second of the server clock leave no start free early in the
    next one (a fixed window would admit it); the refusal names the wait to the next free
    start, a start just before it is refused and one at it is admitted."""
    client = redis.Redis.from_url(modes_redis.url)
    lock = RedisLock(client, f"modes:slide:{{{name}}}", timeout=5)
    _at_server_phase(client, 800, 1000)
    assert next_start(lock, "a", "2/s") is None
    time.sleep(0.1)
    assert next_start(lock, "b", "2/s") is None
    time.sleep(0.2)  # into the next second of the server clock
    retry_in = next_start(lock, "c", "2/s")
    assert retry_in is not None
    assert 0.5 < retry_in <= 0.7
    time.sleep(retry_in - 0.05)
    assert next_start(lock, "c", "2/s") is not None  # 50 ms early: still refused
    time.sleep(0.06)
    assert next_start(lock, "c", "2/s") is None
    assert client.zcard(starts_key(lock.name)) == 2  # a is out of the window, b and c in
    assert 1000 < client.pttl(starts_key(lock.name)) <= 2000
    client.close()


def test_eager_retry_sits_out_the_countdown(modes_redis: Any, name: str) -> None:
    """Under task_always_eager (where Celery re-runs a retry at once) a throttled "retry"
    run waits for the next free start instead of retrying itself into recursion: three
    calls at "1/s" all run, a second apart, each throttled at most once."""
    app = Celery("eager", broker="memory://", set_as_current=False)
    app.conf.update(singleton_lock_url=modes_redis.url, task_always_eager=True)
    starts: list[float] = []
    throttled: list[str] = []

    def count(sender: Any = None, task_id: str = "", **_: Any) -> None:
        throttled.append(task_id)

    lock_throttled.connect(count, weak=False, dispatch_uid="test.eager.count")

    @app.task(name="eager.job", base=LockedTask, shared=False, lock_rate_limit="1/s",
              lock_on_conflict="retry", max_retries=None)  # fmt: skip
    def job(key: str) -> str:
        """Records when it starts."""
        starts.append(time.monotonic())
        return key

    try:
        assert [job.delay(name).get() for _ in range(3)] == [name] * 3
    finally:
        lock_throttled.disconnect(dispatch_uid="test.eager.count")
        clear_settings(app)
        app.close()
    assert len(throttled) == 2  # the second and third call, once each
    assert len(starts) == 3
    assert all(later - earlier >= 1.0 - SLACK for earlier, later in itertools.pairwise(starts))
