"""``lock_release`` / ``lock_hold`` on a real prefork worker and a real redis-server: when
the key frees (at the start, at the end, or ``lock_hold`` after a success), who it names
meanwhile, and that failures, retries and killed runs are no success."""

from __future__ import annotations

import json
import os
import signal
import time
from types import ModuleType

import pytest
import redis
from celery.exceptions import WorkerLostError

from celery_singleton_lock import skip_info
from celery_singleton_lock.testing import CeleryWorker
from tests.modes.conftest import ledger, recorded, wait_signal
from tests.worker.conftest import wait_for

pytestmark = pytest.mark.slow


def _value(data: redis.Redis, key: str) -> tuple[int, dict[str, object]]:
    """The lock value's lease end (server ms) and holder info."""
    raw = data.get(key)
    assert raw is not None, f"{key} is not held"
    expiry, _flag, _token, _fence, info = raw.split(":", 4)
    return int(expiry), json.loads(info)


def _server_ms(data: redis.Redis) -> int:
    seconds, micros = data.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_release_start_frees_the_key_as_the_body_starts(
    modesproj: ModuleType, modes_worker: CeleryWorker, data: redis.Redis, name: str
) -> None:
    """Queue scope with lock_release="start": while the message waits (a countdown) its
    duplicates share its id; once its body starts the key is free and current_lock() is
    None, so a new call publishes and runs alongside it (the first runs until the test
    opens its gate, so "alongside" does not hang on the machine's pace)."""
    key = modesproj.start_release.lock_key(name, 0)
    first = modesproj.start_release.apply_async((name, -1), countdown=1.0)
    assert modesproj.start_release.delay(name, -1).id == first.id
    assert wait_for(lambda: ledger(data, name), timeout=15)
    assert ledger(data, name)[0]["holds_lock"] is False
    released = wait_signal(data, key, "lock_released")
    assert (released["task_id"], released["state"]) == (first.id, "STARTED")
    second = modesproj.start_release.delay(name, 0.1)
    assert second.id != first.id
    assert second.get(timeout=30) == second.id
    assert not modesproj.start_release.AsyncResult(first.id).ready()  # ran alongside it
    data.set(modesproj.gate_key(name), 1, ex=600)
    assert first.get(timeout=30) == first.id
    assert data.get(key) is None


def test_self_retry_after_a_start_release_is_published_even_when_the_key_is_taken(
    modesproj: ModuleType, modes_worker: CeleryWorker, data: redis.Redis, name: str
) -> None:
    """A lock_release="start" run whose key another message took meanwhile still gets its
    self.retry() published (it is the work itself): both messages finish."""
    first = modesproj.start_retry.delay(name, 1.0, True)
    assert wait_for(lambda: ledger(data, name), timeout=15)
    second = modesproj.start_retry.apply_async((name, 0.05, False), countdown=3.0)
    assert second.id != first.id  # the key freed at the start: a new message holds it now
    assert first.get(timeout=15) == first.id  # the retry ran although second held the key
    assert second.get(timeout=15) == second.id
    ran = [entry["task_id"] for entry in ledger(data, name)]
    assert sorted(ran) == sorted([first.id, first.id, second.id])


def test_success_keeps_the_key_for_lock_hold_and_duplicates_get_its_result(
    modesproj: ModuleType, modes_worker: CeleryWorker, data: redis.Redis, name: str
) -> None:
    """Queue scope with lock_release="success", lock_hold=6: after a success, duplicates
    publish nothing and get the successful run's result at once; the held key names that
    run (no pid), keeps its end (not renewed) and frees about six seconds after the run.

    The hold's end is read off the server's clock (the value's lease end): every later check
    of "still held" is made against it, so a slow machine cannot fail it; the steps here
    take milliseconds of the hold's six seconds."""
    key = modesproj.success_queue.lock_key(name)
    published = _server_ms(data)
    first = modesproj.success_queue.delay(name)
    assert first.get(timeout=15) == first.id
    duplicate = modesproj.success_queue.delay(name)
    assert duplicate.id == first.id
    assert duplicate.get(timeout=30) == first.id
    expiry, info = _value(data, key)
    assert (info["task_id"], info["held"]) == (first.id, "success")
    assert "pid" not in info
    # 6 s from the run's release, which came after the publish and before this read
    assert published + 6000 <= expiry <= _server_ms(data) + 6000
    released = wait_signal(data, key, "lock_released")
    assert (released["task_id"], released["state"], released["hold"]) == (first.id, "SUCCESS", 6.0)
    time.sleep(0.6)  # three renewal periods of the 0.6 s lease: no renewal may move the end
    raw = data.get(key)
    if raw is None:  # gone only if this machine outslept the hold
        assert _server_ms(data) >= expiry
    else:
        assert int(raw.split(":")[0]) == expiry
    # 0.5 s before the hold's end by the server's clock: a call then still gets the first's id
    wait_for(lambda: _server_ms(data) >= expiry - 500, timeout=30)
    late = modesproj.success_queue.delay(name)
    if _server_ms(data) < expiry:  # published while held (on a quiet machine, always)
        assert late.id == first.id
    else:
        late.get(timeout=15)  # published after the hold's end: a run of its own
    assert wait_for(lambda: data.get(key) is None, timeout=30)  # freed at the hold's end
    assert _server_ms(data) >= expiry
    third = modesproj.success_queue.delay(name)
    assert third.id != first.id
    assert third.get(timeout=15) == third.id


def test_failed_run_frees_the_key_at_once_under_success(
    modesproj: ModuleType, modes_worker: CeleryWorker, data: redis.Redis, name: str
) -> None:
    """Under lock_release="success" a failed run releases its key as it ends: the next
    call publishes a new message and runs."""
    key = modesproj.success_queue.lock_key(name)
    first = modesproj.success_queue.delay(name, True)
    with pytest.raises(RuntimeError, match="the run failed"):
        first.get(timeout=15)
    assert data.get(key) is None
    second = modesproj.success_queue.delay(name)
    assert second.id != first.id
    assert second.get(timeout=15) == second.id


def test_run_scope_success_hold_makes_runs_in_the_window_meet_the_policy(
    modesproj: ModuleType, modes_worker: CeleryWorker, data: redis.Redis, name: str
) -> None:
    """In run scope a successful run keeps its key lock_hold (1.5 s) after it ended: a call
    in that window is skipped (skip_info names the successful run), one after it runs.

    Whether the second call's run fell in the window is read off the clocks, not assumed:
    it is skipped when it tried before the hold's end (the first's body end + 1.5 s at
    least), and may only run if it started after that."""
    first = modesproj.success_run.delay(name)
    assert first.get(timeout=15) == "attempt 1"
    first_end = ledger(data, name, "ends")[0]["at"]  # wall time; the hold ends >= 1.5 s on
    second = modesproj.success_run.delay(name)
    got = second.get(timeout=30)
    if got is None:  # tried in the window (on a quiet machine, always)
        skip = skip_info(second)
        assert skip is not None
        assert (skip.holder_task_id, skip.reason) == (first.id, "held")
    else:  # this machine was slower than the window: it must have started after it
        assert got == "attempt 1"
        assert ledger(data, name)[-1]["at"] >= first_end + 1.5
    # after every hold so far has ended (the last run's end + 1.5 s, and 0.2 s more)
    last_end = ledger(data, name, "ends")[-1]["at"]
    time.sleep(max(0.0, last_end + 1.7 - time.time()))
    assert modesproj.success_run.delay(name).get(timeout=15) == "attempt 1"
    assert len(ledger(data, name)) == (2 if got is None else 3)


def test_a_retried_attempt_is_not_a_success(
    modesproj: ModuleType, modes_worker: CeleryWorker, data: redis.Redis, name: str
) -> None:
    """A run-scope attempt under lock_release="success" that calls self.retry() frees its
    key as it ends: another call runs during the countdown, and the retried attempt runs
    once that call's success hold is over."""
    key = modesproj.success_run.lock_key(name)
    first = modesproj.success_run.delay(name, True)
    assert wait_for(
        lambda: [e for e in recorded(data, key, "lock_released") if e["state"] == "RETRY"], 15
    )
    assert data.get(key) is None
    other = modesproj.success_run.delay(name)
    assert other.get(timeout=30) == "attempt 1"  # ran: the retry held nothing
    # The retried attempt may meet other's success hold and come back once more.
    assert first.get(timeout=60) in ("attempt 2", "attempt 3")
    assert [entry["task_id"] for entry in ledger(data, name)] == [first.id, other.id, first.id]


def test_success_hold_does_not_keep_the_key_of_a_killed_run(
    modesproj: ModuleType, modes_worker: CeleryWorker, data: redis.Redis, name: str
) -> None:
    """A queue-scope run under lock_release="success" (a 60 s hold) whose pool process is
    SIGKILLed is no success: the worker's parent frees its key at once."""
    key = modesproj.success_killed.lock_key(name)
    first = modesproj.success_killed.delay(name)
    assert wait_for(lambda: ledger(data, name), timeout=15)
    assert _value(data, key)[1]["task_id"] == first.id  # held by the run
    os.kill(ledger(data, name)[0]["pid"], signal.SIGKILL)
    with pytest.raises(WorkerLostError):
        first.get(timeout=20)
    assert wait_for(lambda: data.get(key) is None, timeout=30)
    assert ledger(data, name, "ends") == []
