"""The ``celery locks`` transcripts of docs/operations.md, produced by the real command.

:func:`produce` starts a redis-server of its own, takes locks the way tasks do (a running
holder with a waiter, a queue-scope call and its coalesced follow-up, both slots of a
``lock_limit=2`` key), runs ``celery -A tests.docs.shopproj locks ...`` for each sample and
returns the transcripts, with what changes from run to run (port, lease left, fencing
token, age, probe key, clock, server version) written the same way every time.
``scripts/gen_docs.py`` writes them into the page; ``test_generated.py`` checks that the
page still shows what the command prints.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import redis

from celery_singleton_lock import LockNotOwned, RedisLock
from celery_singleton_lock.engine.keyspace import companion_key
from celery_singleton_lock.engine.protocol import grace_ms
from celery_singleton_lock.engine.value import format_value, parse_value
from celery_singleton_lock.testing import RedisServer
from tests.docs import shopproj

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.docs.shopproj"
#: How the samples name the app and the server.
SHOWN_APP = "proj"
SHOWN_PORT = "6379"
#: The ``celery`` command of this environment (its usage lines then read ``celery ...``).
_SCRIPT = Path(sys.executable).with_name("celery")
CELERY = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "celery"]

# The task ids, hosts and pids the samples' holders and waiters claim to be.
BUY_HOLDER = "d9c1f0de-5b1e-4a59-9a43-2f4e3f2a7c11"
BUY_WAITER = "0b3e9d4a-6c2f-4e8b-b1a7-93f2d5c8e604"
# The purchases that queue behind BUY_WAITER for the EXPLAIN sample, and where they wait.
BUY_LATER = (
    ("6f2a9c1e-8d4b-4e7a-a3c5-1b9e0d7f2a48", "worker-3/6061"),
    ("b8d1e5c3-2f7a-4c96-9e0b-5a4d3c2b1f07", "worker-1/4244"),
)
REPORT_QUEUED = "5e0c7a52-0d7e-4c1b-8e5f-1b2c3d4e5f60"
REPORT_FOLLOW_UP = "a71f2c9e-3b84-4d06-9e5a-c2d18f7b3e45"
EXPORTS = ("1f6b8e2d-7c3a-4f59-8d21-6e9a0b4c5d73", "c4a9e7f1-2d5b-4a83-b6e0-8f1d3c7a9b52")


@dataclass(frozen=True)
class Sample:
    """One command of a transcript: what the page shows as typed, and what it printed."""

    shown: str
    output: str
    status: int


def _run(server: RedisServer, *args: str, stdin: str | None = None, **env: str) -> Sample:
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "CSL_DOCS_URL": server.url, **env}
    done = subprocess.run(
        [*CELERY, "-A", APP, "locks", *args],
        cwd=ROOT, env=environ, input=stdin, stdin=subprocess.DEVNULL if stdin is None else None,
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    shown = " ".join(_quoted(arg) for arg in ("celery", "-A", SHOWN_APP, "locks", *args))
    # What a terminal shows: the prompt (stderr) as typed over, then the answer (stdout).
    output = done.stderr.replace("Clear them? [y/N]: ", "Clear them? [y/N]: y\n")
    return Sample(shown, output + done.stdout, done.returncode)


def _quoted(arg: str) -> str:
    return arg if re.fullmatch(r"[\w./:=-]+", arg) else f"'{arg}'"


#: How long the sample's waiters wait at most: they are let in by the end of the sample,
#: and the bound only matters when the sample fails.
WAIT_BOUND = 900.0


def _wait_until(check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.02)


#: The lease of every hold the samples take: the tasks' default ``lock_timeout``, so that
#: ``locks explain`` knows it (and says whether it was renewed).
LEASE_MS = 30_000


def _hold(
    client: redis.Redis, key: str, task_id: str, task: str, where: str, **kw: int
) -> RedisLock:
    host, pid = where.split("/")
    info = {"task_id": task_id, "task": task, "host": host, "pid": int(pid)}
    lock = RedisLock(client, key, timeout=LEASE_MS / 1000, holder_info=info, **kw)
    if not lock.acquire(blocking=False):
        raise RuntimeError(f"{key} is taken")
    return lock


@contextlib.contextmanager
def _kept(locks: list[RedisLock]) -> Iterator[None]:
    """Keep the leases of ``locks`` (and of any lock added to the list later) from running
    out while the commands run (each one starts a Python process: on a busy machine,
    together longer than the lease), then stop. A hold a command cleared is left alone."""
    stop = threading.Event()

    def keep() -> None:
        while not stop.wait(2.0):
            for lock in list(locks):
                with contextlib.suppress(LockNotOwned):
                    lock.extend()

    keeper = threading.Thread(target=keep, daemon=True)
    keeper.start()
    try:
        yield
    finally:
        stop.set()
        keeper.join(timeout=60)


def _begin_again(client: redis.Redis, key: str) -> None:
    """Make the running hold at ``key`` one that began now, on the server's clock: the same
    holder, a fresh 30 s lease and a fencing token of now, as when a purchase starts (the
    hold :func:`_kept` renewed would show its renewal)."""
    raw = client.get(key)
    if raw is None:
        raise RuntimeError(f"{key} is not held")
    held = parse_value(raw)
    seconds, micros = client.time()
    now_us = int(seconds) * 1_000_000 + int(micros)
    value = format_value(
        now_us // 1000 + LEASE_MS, held.waiters, held.token or "", now_us, held.info
    )
    client.set(key, value, px=LEASE_MS + grace_ms(LEASE_MS))


def _publish(server: RedisServer, code: str) -> None:
    """Call the project's tasks from a producer process of its own (as a web app would)."""
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "CSL_DOCS_URL": server.url}
    subprocess.run(
        [sys.executable, "-c", f"from {APP} import *\n{code}"],
        cwd=ROOT, env=environ, check=True, timeout=60, capture_output=True,
    )  # fmt: skip


def produce() -> dict[str, str]:
    """Every transcript of the page, by name, each normalized (see :func:`normalize`)."""
    with RedisServer(extra_args=("--maxmemory-policy", "allkeys-lru")) as server:
        client = redis.Redis.from_url(server.url)
        try:
            return _produce(server, client)
        finally:
            client.close()


def _produce(server: RedisServer, client: redis.Redis) -> dict[str, str]:
    buy = shopproj.buy.lock_key("sku-42", 7)
    export = shopproj.export.lock_key(42, "q3")
    holder = _hold(client, buy, BUY_HOLDER, "shop.buy", "worker-1/4242")
    kept = [holder]
    with _kept(kept):
        # fallback_poll: a waiter keeps its place in the queue for its poll period; a long one
        # keeps it however late a busy machine lets the thread look again.
        waiter = RedisLock(
            client,
            buy,
            timeout=30.0,
            holder_info=_info(BUY_WAITER, "worker-2/5151"),
            fallback_poll=5.0,
        )
        # It waits until the key is deleted below, after every command has run: its bound must
        # outlast all of them, however slow the machine (each starts a Python process).
        waiting = threading.Thread(
            target=waiter.acquire, kwargs={"timeout": WAIT_BOUND}, daemon=True
        )
        waiting.start()
        _wait_until(lambda: client.zcard(companion_key(buy, "queue")) == 1, "the waiter queued")
        _publish(
            server,
            f"nightly_report.apply_async(('2026-11-24',), task_id={REPORT_QUEUED!r})\n"
            f"nightly_report.apply_async(('2026-11-25',), task_id={REPORT_FOLLOW_UP!r})",
        )
        for task_id, where in zip(EXPORTS, ("worker-1/4243", "worker-2/5150"), strict=True):
            kept.append(_hold(client, export, task_id, "shop.export", where, limit=2))

        samples: dict[str, list[Sample]] = {
            "LIST": [_run(server, "list")],
            "KEY": [
                _run(server, "key", "shop.buy", '["sku-42", 7]'),
                _run(server, "key", "shop.buy", '["sku-42"]'),
                _run(server, "key", "shop.buy", "[]", '{"user_id": 7}'),
            ],
            "CLEAR": [
                _run(server, "clear", export, stdin="y\n"),
                _run(server, "list", "--match", "csl:shop.export:*"),
            ],
        }
        client.execute_command(
            "ACL", "SETUSER", "locker", "on", ">pw", "~*", "&*", "+@all", "-pexpire", "-evalsha"
        )
        locker = server.url.replace("redis://", "redis://locker:pw@")
        samples["CHECK"] = [_run(server, "check", CSL_DOCS_LOCK_URL=locker)]
        later = _queue_behind(client, buy)
    _begin_again(client, buy)
    samples["EXPLAIN"] = [_run(server, "explain", "shop.buy", '"sku-42"', "7")]
    client.delete(buy)  # the waiter takes it and gives up waiting
    waiting.join(timeout=60)
    with contextlib.suppress(LockNotOwned):
        waiter.release()  # the purchases queued behind it take their turns
    for thread in later:
        thread.join(timeout=60)
    texts = {name: transcript(runs) for name, runs in samples.items()}
    fences = _fence_numbers(texts.values())
    shown = {name: normalize(text, fences) for name, text in texts.items()}
    shown["EXPLAIN"] = normalize_explain(shown["EXPLAIN"], fences)
    return shown


def _info(task_id: str, where: str) -> dict[str, object]:
    """The holder info of a ``shop.buy`` run of ``task_id`` on ``where`` (host/pid)."""
    host, pid = where.split("/")
    return {"task_id": task_id, "task": "shop.buy", "host": host, "pid": int(pid)}


def _queue_behind(client: redis.Redis, key: str) -> list[threading.Thread]:
    """Queue the BUY_LATER purchases behind the waiter already there, one after the other,
    each taking its turn (and giving it back) when it comes."""

    def take_turn(lock: RedisLock) -> None:
        if lock.acquire(timeout=WAIT_BOUND):
            lock.release()

    def queued(count: int) -> Callable[[], bool]:
        return lambda: int(client.zcard(companion_key(key, "queue"))) == count

    threads = []
    for count, (task_id, where) in enumerate(BUY_LATER, start=2):
        lock = RedisLock(
            client, key, timeout=30.0, holder_info=_info(task_id, where), fallback_poll=5.0
        )
        threads.append(threading.Thread(target=take_turn, args=(lock,), daemon=True))
        threads[-1].start()
        _wait_until(queued(count), "a purchase queued")
    return threads


def _fence_numbers(texts: Iterable[str]) -> dict[str, str]:
    """Every fencing token the transcripts show, numbered in the order they were issued."""
    found = sorted({token for text in texts for token in re.findall(r"\b\d{16}\b", text)})
    return {token: str(_FENCE_BASE + 397 * rank) for rank, token in enumerate(found)}


def transcript(runs: list[Sample]) -> str:
    """The runs as a console session: ``$ command``, its output, and ``$ echo $?`` after a
    command that failed."""
    lines: list[str] = []
    for run in runs:
        lines.append(f"$ {run.shown}")
        lines.extend(run.output.rstrip("\n").splitlines())
        if run.status:
            lines.extend(["$ echo $?", str(run.status)])
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- normalizing

_FENCE_BASE = 1795316942953000
_FIXED = (
    (re.compile(r"127\.0\.0\.1:\d+"), f"127.0.0.1:{SHOWN_PORT}"),
    (re.compile(r"\b(Redis|Valkey) \d+\.\d+\.\d+"), "Redis 7.2.5"),
    (
        re.compile(r"server clock \d+ ms (?:ahead of|behind) this host's \(round trip [\d.]+ ms\)"),
        "server clock 0 ms behind this host's (round trip 0.1 ms)",
    ),
    (re.compile(r"check:\{[0-9a-f]{12}\}"), "check:{42d097d341b0}"),
    (re.compile(r"redis://[^ ]*@"), "redis://locker:**@"),
    (re.compile(r"python -m celery"), "celery"),
)


def normalize(text: str, fences: dict[str, str]) -> str:
    """``text`` with every value that changes from run to run written one fixed way: the
    server's port, version and clock, the probe key, and in ``locks list`` tables the lease
    left (shown as 29.6 s, every hold being 30 s), the fencing tokens (numbered in order), the ages
    (shown as 2.1 s) and the order of the rows (by key, as SCAN's order changes with the
    server's hash seed); the tables are then aligned again. ``fences`` maps each token
    to the one shown."""
    for pattern, fixed in _FIXED:
        text = pattern.sub(fixed, text)
    lines = text.splitlines()
    out: list[str] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        out.append(line)
        index += 1
        if not line.startswith("KEY "):
            continue
        table = [line]
        while index < len(lines) and lines[index] and not lines[index].startswith("$ "):
            table.append(lines[index])
            index += 1
        out[-1:] = _normalized_table(table, fences)
    return "\n".join(out) + "\n"


#: What ``locks explain`` shows that changes from run to run, and how the page shows it:
#: the holder's age and start (the age ``locks list`` shows; the start its fencing token
#: shown, _FENCE_BASE, says), its lease left (every hold of the samples is taken for 30 s)
#: and the waiters' waits (by position).
_EXPLAIN_FIXED = (
    (re.compile(r"running for [\d.]+s \(since \d\d:\d\d:\d\d UTC\)"),
     "running for 2.1s (since 03:09:02 UTC)"),
    (re.compile(r"lease left [\d.]+s"), "lease left 29.6s"),
)  # fmt: skip
_EXPLAIN_WAITS = ("2.0s", "1.3s", "0.6s")


def normalize_explain(text: str, fences: dict[str, str]) -> str:
    """A ``locks explain`` transcript with what changes from run to run written one fixed
    way (see :data:`_EXPLAIN_FIXED`; the fencing tokens as ``fences`` maps them)."""
    for pattern, fixed in _EXPLAIN_FIXED:
        text = pattern.sub(fixed, text)
    text = re.sub(r"fence (\d{16})", lambda found: f"fence {fences[found.group(1)]}", text)
    return re.sub(
        r"^( +(\d+)\. .*, waiting )[\d.]+s$",
        lambda found: found.group(1) + _EXPLAIN_WAITS[int(found.group(2)) - 1],
        text,
        flags=re.M,
    )


def _normalized_table(lines: list[str], fences: dict[str, str]) -> list[str]:
    rows = [re.split(r" {2,}", line.rstrip()) for line in lines]
    heading = rows[0]
    rows[1:] = sorted(rows[1:])  # SCAN's order changes with the server's hash seed
    for row in rows[1:]:
        row.extend(["-"] * (len(heading) - len(row)))
        for column, cell in enumerate(row):
            name = heading[column]
            if name == "LEASE LEFT" and cell.endswith("s"):
                # Every hold of the samples is taken for 30 s; a loaded machine only
                # changes how much of it is left when the command runs.
                row[column] = "29.6s"
            elif name == "FENCE" and cell.isdigit():
                row[column] = fences.get(cell, cell)
            elif name == "AGE" and cell.endswith("s"):
                row[column] = "2.1s"
            elif name == "HOST/PID" and not cell.startswith("worker-") and cell != "-":
                row[column] = "web-1/977"  # the producer process of the sample
    widths = [max(len(row[column]) for row in rows) for column in range(len(heading))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
