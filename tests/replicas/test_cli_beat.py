"""``celery locks beat [--json]`` against two real ``LeaderScheduler`` replicas: the leader
(replica, host/pid, since, lease left, fencing token), the replicas seen with their roles,
and the last slot taken per entry."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from celery_singleton_lock.testing import CeleryBeat, RedisServer, free_port
from tests.replicas.harness import APP, ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def locks_beat(env: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", APP, "locks", "beat", *extra],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_locks_beat_shows_the_leader_the_replicas_and_the_slots(tmp_path: Path) -> None:
    """With two replicas running, one is the leader (its pid is a replica's, its lease is
    at most the lease), the other stands by, and entry ``fast`` has a slot sent."""
    with RedisServer() as broker, RedisServer() as lock:
        env = {
            **os.environ,
            "CSL_BEAT_BROKER": broker.url,
            "CSL_BEAT_LOCK": lock.url,
            "CSL_BEAT_LEASE": "2",
            "CSL_BEAT_ENTRIES": "fast",
            "PYTHONPATH": str(ROOT),
        }
        first = CeleryBeat(APP, extra_args=["-S", "celery_singleton_lock.beat:LeaderScheduler"],
                           env=env, cwd=ROOT, schedule=tmp_path / "a", name="a")  # fmt: skip
        second = CeleryBeat(APP, extra_args=["-S", "celery_singleton_lock.beat:LeaderScheduler"],
                            env=env, cwd=ROOT, schedule=tmp_path / "b", name="b")  # fmt: skip
        with first, second:
            pids = {first.pid, second.pid}
            deadline = time.monotonic() + 60
            state: dict[str, Any] = {}
            while time.monotonic() < deadline:
                done = locks_beat(env, "--json")
                assert done.returncode == 0, done.stderr
                state = json.loads(done.stdout)
                roles = sorted(r["role"] for r in state["replicas"])
                sent = state["slots"].get("fast", {}).get("state") == "sent"
                if state["leader"] and roles == ["leader", "standby"] and sent:
                    break
                time.sleep(0.2)
            text = locks_beat(env)
    leader = state["leader"]
    assert leader is not None, state
    assert leader["pid"] in pids
    assert 0 < leader["lease_left"] <= 2.0
    assert isinstance(leader["fencing_token"], int)
    assert leader["since"] is not None
    assert sorted(r["pid"] for r in state["replicas"]) == sorted(pids)
    assert state["key"] == "csl:beat:{beatproj}"
    assert text.returncode == 0, text.stderr
    assert "Beat group 'beatproj'" in text.stdout
    assert f"/{leader['pid']}, since" in text.stdout
    assert "fast" in text.stdout
    assert "sent" in text.stdout


def scrape(port: int) -> dict[str, float]:
    """The samples of ``/metrics`` whose name starts with the beat counters' prefix."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
        text = page.read().decode()
    found = {}
    for line in text.splitlines():
        if line.startswith("celery_singleton_lock_beat_"):
            name, _, value = line.rpartition(" ")
            found[name] = float(value)
    return found


def test_beat_counters_are_served_from_the_beat_process(tmp_path: Path) -> None:
    """A replica that enables the metrics counts its election and every slot it sends."""
    port = free_port()
    with RedisServer() as broker, RedisServer() as lock:
        env = {
            **os.environ,
            "CSL_BEAT_BROKER": broker.url,
            "CSL_BEAT_LOCK": lock.url,
            "CSL_BEAT_LEASE": "2",
            "CSL_BEAT_ENTRIES": "fast",
            "CSL_BEAT_METRICS_PORT": str(port),
            "PYTHONPATH": str(ROOT),
        }
        beat = CeleryBeat(APP, extra_args=["-S", "celery_singleton_lock.beat:LeaderScheduler"],
                          env=env, cwd=ROOT, schedule=tmp_path / "m", name="m")  # fmt: skip
        with beat:
            deadline = time.monotonic() + 60
            found: dict[str, float] = {}
            while time.monotonic() < deadline:
                try:
                    found = scrape(port)
                except OSError:
                    found = {}
                if found.get('celery_singleton_lock_beat_slots_total{outcome="sent"}', 0) >= 2:
                    break
                time.sleep(0.2)
    assert found.get("celery_singleton_lock_beat_elected_total") == 1.0, found
    assert found.get('celery_singleton_lock_beat_slots_total{outcome="sent"}', 0) >= 2, found


def test_a_leader_that_stops_hands_over_without_waiting_for_its_lease(tmp_path: Path) -> None:
    """SIGTERM to the leader (beat's warm stop) releases its lease: the other replica leads
    before the lease the leader had (10 s, read on the lock Redis's clock) would have run
    out."""
    with RedisServer() as broker, RedisServer() as lock:
        env = {
            **os.environ,
            "CSL_BEAT_BROKER": broker.url,
            "CSL_BEAT_LOCK": lock.url,
            "CSL_BEAT_LEASE": "10",
            "CSL_BEAT_ENTRIES": "fast",
            "PYTHONPATH": str(ROOT),
        }
        beats = {
            name: CeleryBeat(
                APP,
                extra_args=["-S", "celery_singleton_lock.beat:LeaderScheduler"],
                env=env,
                cwd=ROOT,
                schedule=tmp_path / name,
                name=name,
            )
            for name in ("a", "b")
        }
        with beats["a"], beats["b"]:

            def state() -> dict[str, Any]:
                done = locks_beat(env, "--json")
                assert done.returncode == 0, done.stderr
                return dict(json.loads(done.stdout))

            deadline = time.monotonic() + 60
            while (found := state())["leader"] is None or len(found["replicas"]) < 2:
                assert time.monotonic() < deadline, found
                time.sleep(0.2)
            leader = found["leader"]
            lease_ends = dt.datetime.fromisoformat(found["now"]) + dt.timedelta(
                seconds=leader["lease_left"]
            )
            (stopping,) = [b for b in beats.values() if b.pid == leader["pid"]]
            stopping.stop(timeout=30)
            while (after := state())["leader"] is None or after["leader"]["pid"] == leader["pid"]:
                assert time.monotonic() < deadline + 60, after
                time.sleep(0.1)
    since = dt.datetime.fromisoformat(after["leader"]["since"] or after["now"])
    assert since < lease_ends, (since, lease_ends)
    assert after["leader"]["fencing_token"] > leader["fencing_token"]
