"""``lock_rate_limit`` on real prefork workers and a real redis-server: the sliding window
holds across workers (a ledger of start times checked for every window), and each policy
applies to a throttled run, visibly (signal, worker event, metric, skip record)."""

from __future__ import annotations

import itertools
import threading
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
from celery_singleton_lock.engine.constants import STARTS_TTL_SLACK_MS
from celery_singleton_lock.modes.throttle import next_start, starts_key
from celery_singleton_lock.signals import lock_throttled
from celery_singleton_lock.testing import CeleryWorker
from tests.modes.conftest import ledger, recorded, wait_signal
from tests.observe.test_skip import EventCapture
from tests.worker.conftest import wait_for

pytestmark = pytest.mark.slow


def _admitted(data: redis.Redis, name: str, seen: dict[str, int] | None = None) -> list[int]:
    """When the throttle admitted each start of ``name``, in server ms, oldest first: the
    score of its member of the starts set, as the run's body copied it (``admitted``) or
    a ``StartsWatch`` saw it. The rate is judged on these, exactly: never on when the
    bodies got round to writing their ledger, which varies with load."""
    at = {member: int(ms) for member, ms in data.hgetall(f"admitted-at:{name}").items()}
    at.update(seen or {})
    return sorted(at.values())


class StartsWatch:
    """Reads a key's starts set every 20 ms while a test runs, keeping every member seen
    with its score: a second record of each admission beside the one the body copies (a
    member stays in the set for at least the window after its start)."""

    def __init__(self, data: redis.Redis, key: str) -> None:
        self.data, self.key = data, starts_key(key)
        self.seen: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            for member, score in self.data.zrange(self.key, 0, -1, withscores=True):
                self.seen[member] = int(score)

    def __enter__(self) -> StartsWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _crowded_windows(starts: list[int], limit: int, window_ms: int) -> list[list[int]]:
    """Every run of ``limit + 1`` consecutive admissions (server ms) that fits in less than
    one window (empty when the rate held in every sliding window)."""
    return [
        starts[i : i + limit + 1]
        for i in range(len(starts) - limit)
        if starts[i + limit] - starts[i] < window_ms
    ]


def _expires_by_itself(data: redis.Redis, key: str, window_ms: int) -> None:
    """The starts set has a TTL of at most the window and its slack, or has already gone
    (a busy machine may reach this check after it expired)."""
    ttl = data.pttl(starts_key(key))
    assert ttl == -2 or 0 < ttl <= window_ms + STARTS_TTL_SLACK_MS, ttl


@pytest.mark.timeout(480)  # three prefork workers start on a machine that may be loaded
def test_throttle_holds_across_three_workers(
    modesproj: ModuleType,
    modes_worker: CeleryWorker,
    more_workers: Callable[..., list[CeleryWorker]],
    data: redis.Redis,
    name: str,
) -> None:
    """Fifteen calls of one key under lock_rate_limit="3/s" on three prefork workers: no
    window of one second holds more than three starts, every call runs exactly once, the
    runs take the four seconds the rate demands, and another key keeps its own rate.

    Each worker has a queue of its own and gets five of the calls (a retry stays on its
    queue), so the one key's starts surely come from all three; the windows are checked on
    the server's admission times, exactly."""
    more_workers(2, own_queue=True)
    queues = ["csl-modes", "csl-modes-modes1", "csl-modes-modes2"]
    other = name + "-other"
    key = modesproj.rate_retry.lock_key(name, 0)
    with StartsWatch(data, key) as watch:
        calls = [
            modesproj.rate_retry.apply_async((name, n), queue=queues[n % 3]) for n in range(15)
        ]
        others = [modesproj.rate_retry.delay(other, n) for n in range(3)]
        assert wait_for(lambda: all(r.ready() for r in calls + others), timeout=240)
    assert sorted(r.get(timeout=30) for r in calls) == list(range(15))
    starts = _admitted(data, name, watch.seen)
    assert len(starts) == 15  # every run was admitted once
    assert _crowded_windows(starts, 3, 1000) == []
    assert starts[-1] - starts[0] >= 4000  # 15 starts at 3/s: five windows at least
    assert len(ledger(data, name)) == 15
    workers = {entry["worker"].split("@")[0] for entry in ledger(data, name)}
    assert workers == {"modes0", "modes1", "modes2"}, workers  # the rate held across all
    assert data.get(f"overlaps:{name}") is None  # and the lock kept them apart
    assert len(ledger(data, other)) == 3
    other_key = modesproj.rate_retry.lock_key(other, 0)
    assert recorded(data, other_key, "lock_throttled") == []  # its own rate: never throttled
    assert recorded(data, key, "lock_throttled")  # while the first key's was
    _expires_by_itself(data, key, 1000)  # the window set expires by itself
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
    first, second = _admitted(data, name)
    assert second - first >= 1000  # never sooner than the window allows (server ms)
    throttled = wait_signal(data, key, "lock_throttled")
    assert throttled["policy"] == "wait"
    assert float(throttled["retry_in"]) <= 1.0  # the server named the next free start
    # and it started then, not once lock_wait (5 s) ran out: a bound on the server's
    # clock with about 4 s to spare over the 1 s it should take
    assert second - first < 5000

    slow = name + "-slow"
    options: dict[str, Any] = {"lock_rate_limit": "1/m", "lock_wait": 0.5}
    assert modesproj.rate_wait.apply_async((slow,), **options).get(timeout=15) == "ran"
    late = modesproj.rate_wait.apply_async((slow,), **options)
    with pytest.raises(TaskThrottled) as caught:
        late.get(timeout=30)  # failed, not waited the minute for the next free start
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
    published = _server_ms(data)
    assert second.get(timeout=30) == second.id
    if duplicate.id != second.id:
        # only if this machine stalled until the retried run had started and ended first:
        # the duplicate then ran on its own; else it got the retried message's id
        assert duplicate.get(timeout=30) == duplicate.id
        assert _admitted(data, name)[1] <= published
    starts = _admitted(data, name)
    assert starts[1] - starts[0] >= 1000  # on the server's clock, exactly


def _server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()  # type: ignore[misc]
    return int(seconds) * 1000 + int(micros) // 1000


def test_the_window_slides_on_the_server_clock(modes_redis: Any, name: str) -> None:
    """Two starts late in one second of the server clock leave no start free early in the
    next one (a fixed window would admit it); the refusal names the wait to the next free
    start, a start before it is refused and one at it is admitted.

    Judged on the server's clock, not the test's sleeps: each look at the window is
    bracketed by the server's time before and after it, and must agree with the first
    start's admission time (its member's score) whatever the machine's pace."""
    client = redis.Redis.from_url(modes_redis.url, decode_responses=True)
    lock = RedisLock(client, f"modes:slide:{{{name}}}", timeout=5)
    window = 1000
    # two starts late in one second: from 800 ms into it (a fixed window of that second
    # would reopen at its end, long before the first start leaves the sliding window)
    time.sleep(((800 - _server_ms(client)) % window) / 1000)
    assert next_start(lock, "a", "2/s") is None
    time.sleep(0.1)
    assert next_start(lock, "b", "2/s") is None
    scores = {
        m.split(":")[0]: int(t)
        for m, t in client.zrange(starts_key(lock.name), 0, -1, withscores=True)
    }
    a_at = scores["a"]
    frees_at = a_at + window  # when a leaves the window: the next free start
    while True:  # look until a start is admitted: every answer must fit the server's clock
        before = _server_ms(client)
        retry_in = next_start(lock, "c", "2/s")
        after = _server_ms(client)
        if retry_in is None:
            # never admitted before a left the window (a window fixed to the server's
            # seconds would have admitted it from the next second on, ~800 ms sooner)
            assert after >= frees_at
            break
        assert before < frees_at  # refused only while a was in the window
        assert frees_at - after <= retry_in * 1000 <= frees_at - before  # names the wait
        time.sleep(min(0.05, retry_in / 2))
    members = sorted(m.split(":")[0] for m in client.zrange(starts_key(lock.name), 0, -1))
    if client.pttl(starts_key(lock.name)) != -2:  # unless it expired meanwhile, by itself
        assert members == ["b", "c"]  # a is out of the window, b and c in
    _expires_by_itself(client, lock.name, window)
    client.close()


def test_eager_retry_sits_out_the_countdown(modes_redis: Any, name: str) -> None:
    """Under task_always_eager (where Celery re-runs a retry at once) a throttled "retry"
    run waits for the next free start instead of retrying itself into recursion: three
    calls at "1/s" all run, a second apart, each throttled at most once."""
    app = Celery("eager", broker="memory://", set_as_current=False)
    app.conf.update(singleton_lock_url=modes_redis.url, task_always_eager=True)
    starts: list[int] = []
    throttled: list[str] = []

    def count(sender: Any = None, task_id: str = "", **_: Any) -> None:
        throttled.append(task_id)

    lock_throttled.connect(count, weak=False, dispatch_uid="test.eager.count")

    @app.task(name="eager.job", base=LockedTask, shared=False, lock_rate_limit="1/s",
              lock_on_conflict="retry", max_retries=None)  # fmt: skip
    def job(key: str) -> str:
        """Records when the throttle admitted it (its starts member's score, server ms)."""
        client = redis.Redis.from_url(modes_redis.url, decode_responses=True)
        members = client.zrange(starts_key(job.lock_key(key)), 0, -1, withscores=True)
        client.close()
        starts.extend(int(t) for m, t in members if m.startswith(f"{job.request.id}:"))
        return key

    try:
        assert [job.delay(name).get() for _ in range(3)] == [name] * 3
    finally:
        lock_throttled.disconnect(dispatch_uid="test.eager.count")
        clear_settings(app)
        app.close()
    assert len(throttled) == 2  # the second and third call, once each
    assert len(starts) == 3
    assert all(later - earlier >= 1000 for earlier, later in itertools.pairwise(starts))
