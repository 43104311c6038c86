"""A skipped duplicate on a real worker: its result comes back at once as None, and the
skip is visible as such — ``skip_info``, the ``task-lock-skipped`` worker event, the
``lock_conflict`` signal and an INFO log line."""

from __future__ import annotations

import threading
import time
from types import ModuleType
from typing import Any

import pytest
import redis
from celery import Celery

from celery_singleton_lock import LockedTask, skip_info
from celery_singleton_lock.testing import CeleryWorker, RedisServer
from tests.observe.conftest import wait_signal

pytestmark = pytest.mark.slow


class EventCapture:
    """Consume the app's worker events in a thread until one of ``event_type`` arrives."""

    def __init__(self, app: Celery, event_type: str) -> None:
        self.app = app
        self.event_type = event_type
        self.events: list[dict[str, Any]] = []
        self.ready = threading.Event()
        self.done = threading.Event()
        self.receiver: Any = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        capture = self

        class Receiver(self.app.events.Receiver):  # type: ignore[name-defined,misc]
            def on_consume_ready(self, *args: Any, **kwargs: Any) -> None:
                capture.ready.set()

        def handle(event: dict[str, Any]) -> None:
            self.events.append(event)
            self.done.set()
            self.receiver.should_stop = True

        with self.app.connection_for_read() as conn:
            self.receiver = Receiver(conn, handlers={self.event_type: handle}, app=self.app)
            try:
                self.receiver.capture(limit=None, timeout=60, wakeup=False)
            except Exception:  # the timeout ends the capture: the test reports what is missing
                self.done.set()

    def _subscribers(self) -> int:
        """Connections to the broker Redis subscribed to anything (channels or patterns)."""
        client = redis.Redis.from_url(self.app.conf.broker_url)
        try:
            listed = client.client_list()
        finally:
            client.close()
        return sum(1 for c in listed if int(c.get("sub", 0)) + int(c.get("psub", 0)) > 0)

    def __enter__(self) -> EventCapture:
        before = self._subscribers()
        self.thread.start()
        assert self.ready.wait(30), "the event consumer did not start"
        # the Redis transport subscribes on its first drain: wait until it has (not 1.2 s)
        deadline = time.monotonic() + 30
        while self._subscribers() <= before:
            assert time.monotonic() < deadline, "the event consumer never subscribed"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.receiver is not None:
            self.receiver.should_stop = True
        self.thread.join(timeout=65)


def test_skipped_duplicate_is_prompt_and_visible(
    obsproj: ModuleType, obs_worker: CeleryWorker, data: redis.Redis, name: str
) -> None:
    """While a run holds its key, a duplicate's get() returns None before the holder ends
    (it runs until the test opens its gate: no race with its length), and the skip shows in
    skip_info (key, holder), the task-lock-skipped event, lock_conflict and the worker's
    INFO log; the run that did run has no skip record."""
    key = obsproj.job.lock_key(name, 0)
    first = obsproj.job.delay(name, -1)
    wait_signal(data, key, "lock_acquired")
    with EventCapture(obsproj.app, "task-lock-skipped") as capture:
        duplicate = obsproj.job.delay(name, 0)
        assert duplicate.get(timeout=30) is None  # not waiting for the holder: it never ends
        assert not first.ready()
        assert capture.done.wait(30)
    assert duplicate.state == "SUCCESS"
    skip = skip_info(duplicate)
    assert skip is not None
    assert (skip.key, skip.holder_task_id, skip.task) == (key, first.id, "obs.job")
    assert abs(skip.at - time.time()) < 30
    (event,) = capture.events
    assert (event["type"], event["uuid"]) == ("task-lock-skipped", duplicate.id)
    assert (event["key"], event["holder_task_id"], event["name"]) == (key, first.id, "obs.job")
    assert event["hostname"].startswith("obs@")
    conflict = wait_signal(data, key, "lock_conflict")
    assert (conflict["task_id"], conflict["policy"]) == (duplicate.id, "skip")
    assert f"obs.job[{duplicate.id}] skipped: {key} is held by {first.id}" in obs_worker.log()
    data.set(obsproj.gate_key(f"job:{name}"), 1, ex=600)
    assert first.get(timeout=30) == "ran"
    assert skip_info(first) is None


def test_skip_info_in_an_eager_run(redis_server: RedisServer) -> None:
    """Without a worker (task_always_eager) a skipped run is recorded too, and skip_info
    tells it from a run whose body returned None."""
    app = Celery("eager-skip", broker="memory://", set_as_current=False)
    app.conf.update(task_always_eager=True, singleton_lock_url=redis_server.url,
                    singleton_lock_prefix="eager-skip")  # fmt: skip
    inner: list[Any] = []

    @app.task(base=LockedTask, lock_keys=["n"])
    def nested(n: int, again: bool) -> None:
        if again:
            inner.append(nested.apply(args=(n, False)))

    outer = nested.apply(args=(7, True))
    assert outer.get() is None
    (duplicate,) = inner
    assert duplicate.get() is None
    skip = skip_info(duplicate, app=app)
    assert skip is not None
    assert skip.holder_task_id == outer.id
    assert skip_info(outer, app=app) is None
