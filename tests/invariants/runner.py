"""Run one scenario on real processes and write what happened (an
:class:`~tests.invariants.records.Observation`)::

    python -m tests.invariants.runner SPEC.json OBSERVATION.json [--log-dir DIR]

Run in a process of its own (:func:`run_in_subprocess`), because the app module reads its
servers from the environment when it is imported. The run:

1. starts three private redis-servers on loopback ports: the broker and result backend,
   the lock Redis (the only one faulted) and the ledger;
2. starts the scenario's workers (``celery worker``, prefork or threads, ``acks_late``,
   ``reject_on_worker_lost``, its prefetch multiplier) and waits until they are ready;
3. makes the planned calls at their offsets from this thread, while a second thread injects
   the planned faults, a third polls the result backend (and reads ``skip_info`` the moment
   a call ends without running: a later restart of the lock Redis would lose that record)
   and a fourth notices bodies whose process died without a kill of ours;
4. waits, bounded, until every result id is ready, the broker holds no message (queued or
   unacknowledged) and no body runs; then reads the ledger and stops every process it
   started, by PID.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import redis

from celery_singleton_lock.testing import CeleryWorker, RedisServer
from tests.invariants.driver import Driver, broker_leftovers
from tests.invariants.faults import Injector, WorkerSlot
from tests.invariants.records import FaultRecord, Observation
from tests.invariants.scenario import Scenario

__all__ = ["run_in_subprocess", "run_scenario"]

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.invariants.app"
#: The bounded wait after the last call: every result ready and the broker empty.
DRAIN_TIMEOUT = 45.0
#: A scenario subprocess is stopped after this long (seconds).
SUBPROCESS_TIMEOUT = 300.0


def _say(message: str) -> None:
    print(f"runner: {message}", flush=True)


def _quiet(broker_url: str, queue: str) -> bool:
    """No message queued and none delivered but unacknowledged."""
    with redis.Redis.from_url(broker_url, socket_timeout=5) as client:
        return int(client.llen(queue)) == 0 and int(client.hlen("unacked")) == 0


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def run_scenario(spec: Scenario, log_dir: Path) -> Observation:
    """Run ``spec`` (in this process: it imports the app module) and return what happened."""
    log_dir.mkdir(parents=True, exist_ok=True)
    faults: list[FaultRecord] = []
    with contextlib.ExitStack() as stack:
        broker = stack.enter_context(RedisServer())
        lock = stack.enter_context(RedisServer())
        ledger = stack.enter_context(RedisServer())
        lock_url = f"{lock.url}?socket_timeout=2&socket_connect_timeout=2"
        env = {
            "INV_BROKER": broker.url, "INV_BACKEND": broker.url.replace("/0", "/1"),
            "INV_LOCK": lock_url, "INV_LEDGER": ledger.url, "INV_LEASE": repr(spec.lease),
            "INV_VISIBILITY": repr(spec.visibility_timeout), "INV_WORKER": "driver",
            "INV_MODES": ",".join(spec.modes),
        }  # fmt: skip
        stack.enter_context(_environment(env))
        app = importlib.import_module(APP)
        driver = Driver(app.app, app.TASKS, app.recorder, say=_say)

        def make(info: Any) -> Any:
            def new(start: int) -> CeleryWorker:
                return CeleryWorker(
                    APP, pool=info.pool, concurrency=info.concurrency,
                    hostname=f"{info.name}@%h", cwd=ROOT, ready_timeout=90,
                    log_path=log_dir / f"{info.name}-{start}.log",
                    extra_args=["--prefetch-multiplier", str(info.prefetch)],
                    env={**env, "INV_WORKER": info.name, "PYTHONPATH": str(ROOT)},
                )  # fmt: skip

            return new

        slots = [WorkerSlot(info, make(info)) for info in spec.workers]
        injector = Injector(lock, slots, app.recorder)
        driver.killed = injector.killed

        def stop_workers() -> None:
            injector.lift()
            for slot in slots:
                if slot.process is not None:
                    slot.process.terminate()
            for slot in slots:
                if slot.process is not None:
                    slot.process.stop(timeout=15, terminate=False)

        stack.callback(stop_workers)
        stack.callback(driver.close)
        for slot in slots:
            slot.start(wait=False)
        for slot in slots:
            assert slot.process is not None
            slot.process.wait_ready()
        _say(f"{len(slots)} worker(s) ready; {spec.summary()}")
        began = time.monotonic()

        def inject() -> None:
            for planned in spec.faults:
                delay = began + planned.at - time.monotonic()
                if driver.halt.wait(max(0.0, delay)):
                    return
                try:
                    record = injector.inject(planned)
                except Exception as exc:
                    _say(f"fault {planned.kind} failed: {exc!r}")
                    continue
                faults.append(record)
                _say(f"t={record.t0 - began:6.2f} s {record.kind} {record.target} "
                     f"{record.detail}")  # fmt: skip

        injecting = threading.Thread(target=inject, name="faults", daemon=True)
        injecting.start()
        threads = driver.start()
        for planned in spec.calls:
            time.sleep(max(0.0, began + planned.at - time.monotonic()))
            driver.call(planned)
        injecting.join(timeout=spec.lease + 60)
        calls_done = time.monotonic()
        _say(f"{len(driver.calls)} calls made in {calls_done - began:.1f} s; draining")
        deadline = calls_done + DRAIN_TIMEOUT + spec.visibility_timeout
        settled_since: float | None = None
        while time.monotonic() < deadline:
            quiet = False
            if driver.waiting() == 0:
                with contextlib.suppress(Exception):
                    quiet = _quiet(broker.url, app.QUEUE) and not app.recorder.open_bodies()
            if quiet:
                settled_since = settled_since or time.monotonic()
                if time.monotonic() - settled_since >= 1.0:
                    break
            else:
                settled_since = None
            time.sleep(0.25)
        driver.halt.set()
        for thread in threads:
            thread.join(timeout=15)
        driver.poll_once()
        driver.final_states()
        ended = time.monotonic()
        _say(f"drained in {ended - calls_done:.1f} s ({len(driver.pending)} ids not ready)")
        recorded = app.recorder.read()
        with redis.Redis.from_url(broker.url, socket_timeout=5) as client:
            left = broker_leftovers(client, app.QUEUE)
            # kombu's Redis transport restores unacknowledged messages under this mutex
            # (300 s): one a worker was killed holding blocks every restore until it expires.
            mutex_ms = int(client.pttl("unacked_mutex"))
        notes = {
            "broker_left": left,
            "restore_mutex_ms": mutex_ms,
            "began": began, "calls_done": calls_done, "drain_s": round(ended - calls_done, 1),
            "worker_pids": {slot.info.name: slot.history for slot in slots},
            "summary": spec.summary(),
        }  # fmt: skip
        return Observation(
            seed=spec.seed, lease=spec.lease, visibility_timeout=spec.visibility_timeout,
            calls=driver.calls, bodies=recorded.bodies, execs=recorded.execs,
            receipts=recorded.receipts, signals=recorded.signals, kills=recorded.kills,
            published=recorded.published,
            outcomes=driver.outcomes, faults=faults, workers=list(spec.workers), ended=ended,
            leases_may_be_lost=False, notes=notes,
        )  # fmt: skip
    raise AssertionError("unreachable")  # pragma: no cover


def run_in_subprocess(
    spec: Scenario, work_dir: Path, timeout: float = SUBPROCESS_TIMEOUT
) -> tuple[Observation | None, str]:
    """Run ``spec`` in a fresh Python process; (its observation or None, its output)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    spec_path = work_dir / "scenario.json"
    out_path = work_dir / "observation.json"
    spec_path.write_text(json.dumps(spec.to_json()) + "\n", encoding="utf-8")
    out_path.unlink(missing_ok=True)
    command = [sys.executable, "-m", "tests.invariants.runner", str(spec_path), str(out_path),
               "--log-dir", str(work_dir / "logs")]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with (work_dir / "runner.log").open("wb") as log:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log,
                                   stderr=subprocess.STDOUT)  # fmt: skip
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGTERM)  # it stops its workers and servers
            try:
                process.wait(timeout=40)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
    output = (work_dir / "runner.log").read_text(errors="replace")
    if process.returncode != 0 or not out_path.exists():
        return None, output
    return Observation.load(out_path), output


def main(argv: Sequence[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m tests.invariants.runner")
    parser.add_argument("spec", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--log-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: stop every process
    spec = Scenario.from_json(json.loads(args.spec.read_text(encoding="utf-8")))
    log_dir = args.log_dir or args.out.parent / "logs"
    observation = run_scenario(spec, log_dir)
    observation.dump(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
