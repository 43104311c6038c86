"""The flash-sale demo end to end: real workers on a private redis-server, and Ctrl-C."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from celery_singleton_lock.testing import process_group_alive
from tests.examples.conftest import ROOT, example_env, run_example, started_pids

pytestmark = pytest.mark.slow

#: ``python -c`` program: run the module named by argv[1] as ``python -m`` would, with
#: SIGINT raising KeyboardInterrupt whatever the test process inherited.
AS_FOREGROUND_JOB = (
    "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "module = sys.argv.pop(1); runpy.run_module(module, run_name='__main__', alter_sys=True)"
)

SMALL = ("--orders", "60", "--stock", "10", "--skus", "1", "--workers", "1", "--concurrency", "2")


def table_row(output: str, label: str) -> list[str]:
    """The cells of one row of the results table: [label, no lock, LockedTask]."""
    for line in output.splitlines():
        cells = [cell.strip() for cell in re.split(r"[│|]", line) if cell.strip()]
        if cells and cells[0] == label:
            return cells
    raise AssertionError(f"no row {label!r} in:\n{output}")


def test_demo_sells_exactly_the_stock_with_the_lock() -> None:
    """A small run exits 0, and the locked phase sold 10 of 10 with nothing oversold."""
    done = run_example("examples.flash_sale.demo", *SMALL, timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    assert table_row(done.stdout, "oversold")[2] == "0"
    assert table_row(done.stdout, "sold")[2] == "10 of 10"
    assert table_row(done.stdout, "fencing tokens issued")[2] == "60"
    assert table_row(done.stdout, "failed / timed out")[1:] == ["0 / no", "0 / no"]
    assert "oversold 0" in done.stdout


def test_demo_help_documents_every_option() -> None:
    """``--help`` names every option and the REDIS_URL default."""
    done = run_example("examples.flash_sale.demo", "--help", timeout=30)
    assert done.returncode == 0, done.stderr
    for option in ("--orders", "--stock", "--skus", "--workers", "--concurrency", "--redis-url"):
        assert option in done.stdout
    assert "REDIS_URL" in done.stdout


def test_demo_rejects_nonsense_counts() -> None:
    """A count below its minimum is a usage error (status 2), before anything starts."""
    done = run_example("examples.flash_sale.demo", "--workers", "0", timeout=30)
    assert done.returncode == 2
    assert "at least 1" in done.stderr


def _lines(process: subprocess.Popen[str]) -> tuple[queue.Queue[str], threading.Thread]:
    """A queue fed with the process's output lines by a reader thread (which ends at EOF)."""
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    return lines, reader


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie awaiting its reaper does not count)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_ctrl_c_stops_every_process_the_demo_started() -> None:
    """SIGINT to the demo's process group (what a terminal's Ctrl-C does) mid-sale: it
    exits with 130 (within 60 s) and none of its redis-server and worker processes survive.

    The demo starts with SIGINT at its default, as a job in the foreground of a terminal
    does: a suite launched from a non-interactive shell with ``&`` inherits SIGINT ignored,
    and so would the demo (it then never sees the Ctrl-C)."""
    process = subprocess.Popen(
        [sys.executable, "-c", AS_FOREGROUND_JOB, "examples.flash_sale.demo", "--orders",
         "100000", "--skus", "2", "--workers", "1", "--concurrency", "2"],
        cwd=ROOT, env=example_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip
    output: list[str] = []
    lines, reader = _lines(process)
    try:
        deadline = time.monotonic() + 60
        while not any("started flash-sale-w1" in line for line in output):
            assert time.monotonic() < deadline, "".join(output)
            output.append(lines.get(timeout=max(0.1, deadline - time.monotonic())))
        time.sleep(1.0)  # the sale is under way
        os.killpg(process.pid, signal.SIGINT)
        interrupted = time.monotonic()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            time.sleep(0.5)
            while not lines.empty():
                output.append(lines.get())
            pytest.fail(f"still running 60 s after SIGINT; it printed:\n{''.join(output)}")
        # it stopped on the SIGINT (bounded generously: a busy machine stops slowly)
        assert time.monotonic() - interrupted < 60
    finally:
        if process.poll() is None:  # the test failed: clean up what the demo could not
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
            for pid in started_pids("".join(output)):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
        reader.join(timeout=10)  # EOF: the demo and everything holding its stdout are gone
        if process.stdout is not None:
            process.stdout.close()
    while not lines.empty():
        output.append(lines.get())
    text = "".join(output)
    assert process.returncode == 130, text
    pids = started_pids(text)
    assert len(pids) == 2, text  # the redis-server and the worker
    run_id = re.search(r"started flash-sale-w1-(\w+) ", text)
    assert run_id is not None
    deadline = time.monotonic() + 5
    while any(_alive(pid) or process_group_alive(pid) for pid in pids):
        assert time.monotonic() < deadline, f"left running: {pids}"
        time.sleep(0.1)
    survivors = subprocess.run(
        ["pgrep", "-f", run_id.group(1)], capture_output=True, text=True, check=False
    )
    assert survivors.stdout.strip() == ""
