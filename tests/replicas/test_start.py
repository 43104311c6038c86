"""Real ``celery beat`` processes with ``LeaderScheduler``: a bad setting stops beat at
start (status 78, the setting named); the catch-up rule after nobody led; a user's own
scheduler class whose schedule changes at run time."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from celery_singleton_lock.beat.scheduler import group_key
from celery_singleton_lock.engine.value import parse_value
from celery_singleton_lock.testing import CeleryBeat, CeleryProcess, CeleryWorker, RedisServer
from tests.replicas.harness import APP, ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
SCHEDULER = "celery_singleton_lock.beat:LeaderScheduler"


@pytest.fixture
def servers() -> Iterator[tuple[RedisServer, RedisServer]]:
    with RedisServer() as broker, RedisServer() as lock:
        yield broker, lock


def env(broker: RedisServer, lock: RedisServer, **extra: str) -> dict[str, str]:
    return {
        "CSL_BEAT_BROKER": broker.url,
        "CSL_BEAT_LOCK": lock.url,
        "CSL_BEAT_LEASE": "2",
        "CSL_BEAT_ENTRIES": "fast",
        "PYTHONPATH": str(ROOT),
        **extra,
    }


def ledger(broker: RedisServer) -> list[dict[str, object]]:
    client = redis.Redis.from_url(broker.url.rsplit("/", 1)[0] + "/2", socket_timeout=10)
    try:
        return [json.loads(raw) for raw in client.lrange("ledger", 0, -1)]
    finally:
        client.close()


def wait_ledger(broker: RedisServer, count: int, bound: float = 60.0) -> list[dict[str, object]]:
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        lines = ledger(broker)
        if len(lines) >= count:
            return lines
        time.sleep(0.1)
    raise AssertionError(f"fewer than {count} sends in {bound} s: {ledger(broker)}")


@pytest.mark.parametrize(
    ("conf", "named"),
    [
        ({"singleton_beat_leese": 3},
         "singleton_beat_leese: unknown setting (did you mean 'singleton_beat_lease'?)"),
        ({"singleton_beat_scheduler": "no.such:Scheduler"},
         "singleton_beat_scheduler: cannot import"),
        ({"beat_max_loop_interval": 30},
         "singleton_beat_lease (2 s) must be longer than the beat loop interval"),
    ],
)  # fmt: skip
def test_a_bad_setting_stops_beat_at_start(
    servers: tuple[RedisServer, RedisServer], tmp_path: Path, conf: dict[str, object], named: str
) -> None:
    """``celery beat`` exits with status 78 and one line naming the setting."""
    broker, lock = servers
    beat = CeleryProcess(
        ["-A", APP, "beat", "-S", SCHEDULER, "--schedule", str(tmp_path / "s"), "--pidfile", ""],
        env=env(broker, lock, CSL_BEAT_CONF=json.dumps(conf)), cwd=ROOT, name="bad-beat",
    )  # fmt: skip
    beat.start(wait=False)
    try:
        assert beat.process is not None
        assert beat.process.wait(timeout=60) == 78, beat.tail()
        assert named in " ".join(beat.log().split()), beat.tail()
    finally:
        beat.close()


def lease_over(lock: RedisServer, group: str = "beatproj") -> bool:
    """Whether the group's leader lease has ended, by the lock Redis's own clock."""
    client = redis.Redis.from_url(lock.url, socket_timeout=10)
    try:
        raw = client.get(group_key("csl", group))
        seconds, micros = client.time()
        now_ms = int(seconds) * 1000 + int(micros) // 1000
    finally:
        client.close()
    return raw is None or parse_value(raw).holder(now_ms, None) is None


@pytest.mark.parametrize("rule", ["once", "skip"])
def test_catch_up_after_nobody_led(
    servers: tuple[RedisServer, RedisServer], tmp_path: Path, rule: str
) -> None:
    """The only replica is killed; once its lease has ended and at least two more slots
    have come due, another starts: under "once" it sends the most recent missed slot
    (marked caught up) and none before it; under "skip" it sends none of them. No slot
    is sent twice."""
    broker, lock = servers
    variables = env(broker, lock, CSL_BEAT_CATCH_UP=rule, CSL_BEAT_ROLE="worker")
    with CeleryWorker(APP, env=variables, concurrency=1, cwd=ROOT):
        first = CeleryBeat(APP, extra_args=["-S", SCHEDULER], env=variables, cwd=ROOT,
                           schedule=tmp_path / "a", name="first")  # fmt: skip
        with first:
            before = wait_ledger(broker, 3)
            first.kill()
        last_slot = max(int(str(line["slot"])) for line in ledger(broker))
        deadline = time.monotonic() + 60
        while not lease_over(lock) or time.time() * 1000 < last_slot + 3500:
            assert time.monotonic() < deadline, "the lease never ended"
            time.sleep(0.1)
        second = CeleryBeat(APP, extra_args=["-S", SCHEDULER], env=variables, cwd=ROOT,
                            schedule=tmp_path / "b", name="second")  # fmt: skip
        with second:
            wait_ledger(broker, len(ledger(broker)) + 2)
    lines = ledger(broker)
    slots = [int(str(line["slot"])) for line in lines]
    assert len(slots) == len(set(slots)), slots
    after = sorted((line for line in lines if int(str(line["slot"])) > last_slot),
                   key=lambda line: int(str(line["slot"])))  # fmt: skip
    caught = [line for line in after if line["caught_up"]]
    assert int(str(after[0]["slot"])) - last_slot >= 3000, after  # two or more slots skipped
    if rule == "once":
        assert caught == [after[0]], after
        # sent late: it came due before the replica that sent it led
        assert int(str(caught[0]["slot"])) < float(str(caught[0]["sent_at"])) * 1000
    else:
        assert caught == [], after
    assert len(before) >= 3


def test_a_users_scheduler_whose_schedule_changes_at_run_time(
    servers: tuple[RedisServer, RedisServer], tmp_path: Path
) -> None:
    """``singleton_beat_scheduler`` names a user's subclass (its banner line shows it is
    wrapped); when its schedule changes at run time (every 1 s -> every 2 s), the slots
    that follow are 2 s apart from the last one sent, with no burst and no duplicate."""
    broker, lock = servers
    variables = env(
        broker, lock, CSL_BEAT_ROLE="worker",
        CSL_BEAT_SCHEDULER="tests.replicas.beatproj:ChangingScheduler",
    )  # fmt: skip
    data = redis.Redis.from_url(broker.url.rsplit("/", 1)[0] + "/2", socket_timeout=10)
    with CeleryWorker(APP, env=variables, concurrency=1, cwd=ROOT):
        beat = CeleryBeat(APP, extra_args=["-S", SCHEDULER], env=variables, cwd=ROOT,
                          schedule=tmp_path / "c", name="changing")  # fmt: skip
        with beat:
            wait_ledger(broker, 3)
            data.set("beatproj:fast-every", "2")
            changed_at = len(ledger(broker))
            wait_ledger(broker, changed_at + 4)
            banner = beat.log()
    data.close()
    assert "counting scheduler" in banner
    slots = sorted(int(str(line["slot"])) for line in ledger(broker))
    assert len(slots) == len(set(slots))
    gaps = [b - a for a, b in itertools.pairwise(slots)]
    assert gaps[:2] == [1000, 1000], gaps
    assert gaps[-3:] == [2000, 2000, 2000], gaps
    assert all(gap >= 1000 for gap in gaps)


def test_a_failed_publish_gives_the_slot_back(tmp_path: Path) -> None:
    """The broker stops: the leader's publishes fail and their slots are given back (not
    lost as sent); once the broker is back, the most recent missed slot is sent once,
    marked caught up, and no slot is sent twice."""
    with RedisServer() as broker, RedisServer() as lock:
        variables = env(
            broker, lock, CSL_BEAT_ROLE="worker", CSL_BEAT_LEASE="3",
            CSL_BEAT_LEDGER=lock.url.rsplit("/", 1)[0] + "/2",
        )  # fmt: skip
        store = redis.Redis.from_url(variables["CSL_BEAT_LEDGER"], socket_timeout=10)

        def lines() -> list[dict[str, object]]:
            return [json.loads(raw) for raw in store.lrange("ledger", 0, -1)]

        def wait(check: object, bound: float = 90.0) -> None:
            deadline = time.monotonic() + bound
            while not check():  # type: ignore[operator]
                assert time.monotonic() < deadline, lines()
                time.sleep(0.1)

        with CeleryWorker(APP, env=variables, concurrency=1, cwd=ROOT):
            beat = CeleryBeat(APP, extra_args=["-S", SCHEDULER], env=variables, cwd=ROOT,
                              schedule=tmp_path / "p", name="publisher")  # fmt: skip
            with beat:
                wait(lambda: len(lines()) >= 3)
                broker.stop()
                wait(lambda: beat.log().count("failed") >= 2)
                broker.restart()
                wait(lambda: any(line["caught_up"] for line in lines()))
                wait(lambda: sum(not line["caught_up"] for line in lines()) >= 5)
                log = beat.log()
        found = lines()
        store.close()
    slots = [int(str(line["slot"])) for line in found]
    assert len(slots) == len(set(slots)), found
    caught = [line for line in found if line["caught_up"]]
    assert len(caught) == 1, found
    before = [s for s in slots if s < int(str(caught[0]["slot"]))]
    failed = {
        int(dt.datetime.fromisoformat(text).timestamp() * 1000)
        for text in re.findall(r"sending slot (\S+) of 'fast' failed", log)
    }
    assert failed, log
    # no slot whose publish failed was sent before the broker came back; the caught-up
    # send is the most recent slot due then (perhaps one that failed), never a burst
    assert not failed & set(before), (failed, found)
    assert all(slot < int(str(caught[0]["slot"])) for slot in failed - set(slots)), failed
