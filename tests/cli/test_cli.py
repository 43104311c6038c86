"""``celery -A proj locks ...`` run as a real ``celery`` subprocess against a private Redis."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import redis

from celery_singleton_lock import RedisLock
from celery_singleton_lock.engine.keyspace import companion_key
from celery_singleton_lock.engine.protocol import SIGNAL_TTL_MS
from celery_singleton_lock.keys import task_lock_key
from celery_singleton_lock.testing import RedisServer, free_port
from tests.cli import cliproj
from tests.cli.conftest import Run

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[2]
TASK = "shop.buy"


def buy_key(prefix: str, args: list[Any], kwargs: dict[str, Any] | None = None) -> str:
    """The key of a ``shop.buy`` call, computed in this process."""
    return task_lock_key(prefix, TASK, cliproj.buy.run, args, kwargs or {}, ["sku"])


def hold(client: redis.Redis, name: str, task_id: str, *, queued: bool = False) -> RedisLock:
    """Take a real lock on ``name`` as if task ``task_id`` of ``shop.buy`` held it."""
    info: dict[str, Any] = {"task_id": task_id, "task": TASK, "host": "box-1", "pid": 4242}
    if queued:
        info["queued"] = True
    lock = RedisLock(client, name, timeout=600.0, holder_info=info)
    assert lock.acquire(blocking=False)
    return lock


def rows(output: str) -> dict[str, str]:
    """Table lines of ``locks list`` by their first cell (the key)."""
    return {line.split()[0]: line for line in output.splitlines()[2:] if line.strip()}


def test_celery_lists_the_locks_subcommand() -> None:
    """The ``celery.commands`` entry point puts ``locks`` into ``celery --help``."""
    done = subprocess.run(
        [sys.executable, "-m", "celery", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert re.search(r"^\s+locks\s+List, clear", done.stdout, re.MULTILINE), done.stdout


def test_list_shows_holder_lease_and_fencing_token(
    run: Run, client: redis.Redis, prefix: str, redis_server: RedisServer
) -> None:
    """Each held lock is one row with its key, task id and name, host/pid, lease left
    and fencing token, under a header naming the Redis URL; signal lists are not rows."""
    first = hold(client, buy_key(prefix, ["sku-1", 7]), "task-aaa")
    second = hold(client, buy_key(prefix, ["sku-2", 7]), "task-bbb", queued=True)
    client.rpush(companion_key(first.name, "signal"), "1")

    done = run("list")

    assert done.returncode == 0, done.stderr
    header = done.stdout.splitlines()[0]
    assert redis_server.url in header
    assert "2 held" in header
    table = rows(done.stdout)
    assert set(table) == {first.name, second.name}
    line = table[first.name]
    assert "task-aaa" in line
    assert TASK in line
    assert "box-1/4242" in line
    assert str(first.fencing_token) in line
    lease = re.search(r"\s(\d+\.\d)s\s", line)
    assert lease is not None
    assert 0 < float(lease.group(1)) <= 600.0
    assert line.split()[6:8] == ["no", "running"]  # QUEUED, STATE
    assert table[second.name].split()[6:8] == ["yes", "queued"]
    assert list(table) == sorted(table)


def test_list_json_is_a_list_of_objects(run: Run, client: redis.Redis, prefix: str) -> None:
    """``--json`` prints a JSON list with the holder, lease left in seconds and token."""
    lock = hold(client, buy_key(prefix, ["sku-1", 7]), "task-aaa", queued=True)

    done = run("list", "--json")

    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)
    assert row["key"] == lock.name
    assert row["kind"] == "lock"
    assert row["held"] is True
    assert row["task_id"] == "task-aaa"
    assert row["task"] == TASK
    assert (row["host"], row["pid"]) == ("box-1", 4242)
    assert 0 < row["lease_left"] <= 600.0
    assert row["fence"] == lock.fencing_token
    assert row["queued"] is True


def test_list_shows_the_parked_count(run: Run, client: redis.Redis, prefix: str) -> None:
    """A key with calls parked on it shows how many in PARKED (table) and ``parked``
    (JSON); a key without shows ``-`` and 0."""
    busy = hold(client, buy_key(prefix, ["sku-1", 7]), "task-aaa")
    idle = hold(client, buy_key(prefix, ["sku-2", 7]), "task-bbb")
    client.zadd(companion_key(busy.name, "parked"), {"p1": 1, "p2": 2, "p3": 3})

    table = run("list")
    listed = run("list", "--json")

    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[1].split()[-2:] == ["PARKED", "FOLLOW-UP"]
    assert rows(table.stdout)[busy.name].split()[-2] == "3"
    assert rows(table.stdout)[idle.name].split()[-2] == "-"
    parked = {row["key"]: row["parked"] for row in json.loads(listed.stdout)}
    assert parked == {busy.name: 3, idle.name: 0}


def test_list_survives_classic_and_garbage_values(
    run: Run, client: redis.Redis, prefix: str
) -> None:
    """Classic integer timestamps (held or long expired) and garbage bytes each get a row
    instead of crashing the listing."""
    classic = f"{prefix}:classic"
    old = f"{prefix}:old"
    garbage = f"{prefix}:garbage"
    client.set(classic, str(int(time.time()) + 60))
    client.set(old, "12345")
    client.set(garbage, b"\xff\x00 not a lock", ex=60)

    table = run("list")
    listed = run("list", "--json")

    assert table.returncode == 0, table.stderr
    assert set(rows(table.stdout)) == {classic, old, garbage}
    assert "expired" in rows(table.stdout)[old]
    assert listed.returncode == 0, listed.stderr
    by_key = {row["key"]: row for row in json.loads(listed.stdout)}
    assert (by_key[classic]["kind"], by_key[classic]["held"]) == ("classic", True)
    assert 0 < by_key[classic]["lease_left"] <= 61
    assert (by_key[old]["kind"], by_key[old]["held"]) == ("classic", False)
    assert (by_key[garbage]["kind"], by_key[garbage]["held"]) == ("foreign", True)


def test_list_match_finds_locks_outside_the_prefix(
    run: Run, client: redis.Redis, prefix: str
) -> None:
    """A RedisLock named by the user is not under the prefix; ``--match`` lists it."""
    engine = hold(client, f"{prefix}-orders:{{sku-42}}", "task-ccc")

    default = run("list", "--json")
    matched = run("list", "--json", "--match", f"{prefix}-orders:*")

    assert default.returncode == 0, default.stderr
    assert json.loads(default.stdout) == []
    assert matched.returncode == 0, matched.stderr
    assert [row["key"] for row in json.loads(matched.stdout)] == [engine.name]


def test_key_matches_the_in_process_key_however_arguments_are_bound(run: Run, prefix: str) -> None:
    """``locks key`` prints ``keys.task_lock_key``'s key, and positional or keyword
    spellings of one call give that same key."""
    expected = buy_key(prefix, ["sku-1", 7])

    spellings = [
        ("key", TASK, '["sku-1", 7]'),
        ("key", TASK, "[]", '{"sku": "sku-1", "user_id": 7}'),
        ("key", TASK, '["sku-1"]', '{"user_id": 7}'),
        ("key", TASK, '["sku-1", 8]'),  # lock_keys=["sku"]: the user does not count
    ]
    outputs = [run(*args) for args in spellings]

    for done in outputs:
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == expected
    other = run("key", TASK, '["sku-2", 7]')
    assert other.returncode == 0, other.stderr
    assert other.stdout.strip() == buy_key(prefix, ["sku-2", 7]) != expected


def test_key_of_an_unknown_task_names_the_close_ones(run: Run) -> None:
    """An unregistered task name exits non-zero and suggests the registered near names."""
    done = run("key", "shop.bye", '["sku-1", 7]')

    assert done.returncode != 0
    assert "unknown task 'shop.bye'" in done.stderr
    assert "'shop.buy'" in done.stderr
    assert done.stdout == ""


def test_key_rejects_bad_json(run: Run) -> None:
    """Arguments that are not a JSON array / object are a usage error naming the argument."""
    broken = run("key", TASK, "[oops")
    wrong_type = run("key", TASK, '{"sku": "sku-1"}')
    wrong_kwargs = run("key", TASK, "[]", '["sku-1"]')

    assert broken.returncode == 2
    assert "ARGS_JSON" in broken.stderr
    assert "not valid JSON" in broken.stderr
    assert wrong_type.returncode == 2
    assert "must be a JSON array" in wrong_type.stderr
    assert wrong_kwargs.returncode == 2
    assert "KWARGS_JSON" in wrong_kwargs.stderr
    assert "must be a JSON object" in wrong_kwargs.stderr


def test_key_of_an_unlocked_task_is_an_error(run: Run) -> None:
    """A registered task that no lock applies to has no key: a clear error."""
    done = run("key", "shop.restock", '["sku-1"]')

    assert done.returncode == 1
    assert "'shop.restock' is not locked" in done.stderr


def monitored(client: redis.Redis, action: Callable[[], T]) -> tuple[T, list[str]]:
    """``action()``'s result, and the commands the server ran meanwhile (``MONITOR``)."""
    marker = f"monitor-end-{uuid.uuid4().hex}"
    seen: list[str] = []
    ready = threading.Event()

    # Its own connection, without the client's socket timeout: the CLI may take longer to
    # start than that on a busy machine, and a timed-out read would end the watch early.
    kwargs = {**client.connection_pool.connection_kwargs, "socket_timeout": None}
    pool = client.connection_pool
    watcher = redis.Redis(
        connection_pool=redis.ConnectionPool(connection_class=pool.connection_class, **kwargs)
    )

    def watch() -> None:
        with watcher.monitor() as monitor:
            ready.set()
            while True:
                command = str(monitor.next_command()["command"])
                if marker in command:
                    return
                seen.append(command)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    assert ready.wait(30)
    result = action()
    client.echo(marker)
    thread.join(60)
    watcher.close()
    assert not thread.is_alive()
    return result, seen


def test_clear_key_deletes_only_that_lock_and_its_signal_list(
    run: Run, client: redis.Redis, prefix: str
) -> None:
    """``clear KEY --yes`` deletes that lock and no other; its waiters' list is left with a
    wake-up that expires within the signal TTL (so a waiter takes the lock at once)."""
    gone = hold(client, buy_key(prefix, ["sku-1", 7]), "task-aaa")
    kept = hold(client, buy_key(prefix, ["sku-2", 7]), "task-bbb")
    signal = companion_key(gone.name, "signal")
    client.rpush(signal, "1")

    done, commands = monitored(client, lambda: run("clear", gone.name, "--yes"))

    assert done.returncode == 0, done.stderr
    assert "Cleared 1 lock." in done.stdout
    assert client.exists(gone.name) == 0
    # The wake-up and its expiry as the server received them (reading the TTL afterwards
    # would race it: on a busy machine the 2 s can be over before the test looks).
    wrote = [command.split() for command in commands if signal in command]
    assert any(words[0].upper() == "RPUSH" for words in wrote), commands
    assert [signal, str(SIGNAL_TTL_MS)] in [
        words[1:] for words in wrote if words[0].upper() == "PEXPIRE"
    ]
    assert client.pttl(signal) in (-2, *range(1, SIGNAL_TTL_MS + 1))
    assert client.exists(kept.name) == 1


def test_clear_all_deletes_only_our_locks_under_the_prefix(
    run: Run, client: redis.Redis, prefix: str
) -> None:
    """``clear --all --yes`` deletes this package's locks under the prefix; a classic
    timestamp, other data under the prefix and keys outside it stay."""
    held = [hold(client, buy_key(prefix, [f"sku-{n}", 7]), f"task-{n}") for n in range(3)]
    client.rpush(companion_key(held[0].name, "signal"), "1")
    kept = {f"{prefix}:classic": "99999999999", f"{prefix}:notes": "not a lock"}
    for name, value in kept.items():
        client.set(name, value)
    outside = [f"{prefix}-other:x", f"{prefix}x:y"]
    for name in outside:
        client.set(name, "keep me", ex=60)

    done = run("clear", "--all", "--yes")

    assert done.returncode == 0, done.stderr
    assert "Cleared 3 locks" in done.stdout
    assert "left 2 keys that are not locks" in done.stdout
    assert client.exists(*(lock.name for lock in held)) == 0
    for name, value in kept.items():
        assert client.get(name) == value.encode()
    assert client.exists(*outside) == len(outside)


def test_clear_match_deletes_the_matching_locks_as_clear_locks_does(
    run: Run, client: redis.Redis, prefix: str
) -> None:
    """``clear --match 'shop.buy:*' --yes`` deletes exactly the locks ``clear_locks(app,
    'shop.buy:*')`` would: ours below the prefix that match, never other values there."""
    held = [hold(client, buy_key(prefix, [f"sku-{n}", 7]), f"task-{n}") for n in range(2)]
    other = hold(client, f"{prefix}:shop.restock:{{1}}", "task-other")
    notes = f"{prefix}:shop.buy:notes"
    client.set(notes, "not a lock")

    done = run("clear", "--match", "shop.buy:*", "--yes")

    assert done.returncode == 0, done.stderr
    assert f"Cleared 2 locks matching '{prefix}:shop.buy:*'" in done.stdout
    assert "left 1 key that are not locks" in done.stdout
    assert client.exists(*(lock.name for lock in held)) == 0
    assert client.exists(other.name) == 1
    assert client.get(notes) == b"not a lock"
    assert run("clear", "--match", "shop.*", "--all", "--yes").returncode == 2
    assert client.exists(other.name) == 1


def test_clear_without_yes_and_no_stdin_deletes_nothing(
    run: Run, client: redis.Redis, prefix: str
) -> None:
    """With stdin closed the confirmation aborts: non-zero exit, every lock still there."""
    lock = hold(client, buy_key(prefix, ["sku-1", 7]), "task-aaa")

    single = run("clear", lock.name)
    everything = run("clear", "--all")

    for done in (single, everything):
        assert done.returncode != 0
        assert "Aborted" in done.stderr
    assert client.exists(lock.name) == 1


def test_clear_follows_the_typed_answer(run: Run, client: redis.Redis, prefix: str) -> None:
    """Answering "n" keeps the lock; answering "y" clears it."""
    lock = hold(client, buy_key(prefix, ["sku-1", 7]), "task-aaa")

    refused = run("clear", lock.name, stdin="n\n")
    assert refused.returncode != 0
    assert client.exists(lock.name) == 1

    accepted = run("clear", lock.name, stdin="y\n")
    assert accepted.returncode == 0, accepted.stderr
    assert client.exists(lock.name) == 0


def test_clear_needs_keys_or_all_but_not_both(run: Run, client: redis.Redis, prefix: str) -> None:
    """``clear`` with neither KEYs nor --all, or with both, is a usage error."""
    lock = hold(client, buy_key(prefix, ["sku-1", 7]), "task-aaa")

    neither = run("clear", "--yes")
    both = run("clear", lock.name, "--all", "--yes")

    assert neither.returncode == 2
    assert "--all" in neither.stderr
    assert both.returncode == 2
    assert client.exists(lock.name) == 1


def test_clear_refuses_a_key_that_is_not_a_lock(run: Run, client: redis.Redis, prefix: str) -> None:
    """A non-string key outside the prefix (e.g. a broker queue) is refused, and then no
    key of that call is deleted."""
    lock = hold(client, buy_key(prefix, ["sku-1", 7]), "task-aaa")
    queue = f"{prefix}-queue"
    client.rpush(queue, "message")

    done = run("clear", lock.name, queue, "--yes")

    assert done.returncode == 1
    assert "not locks" in done.stderr
    assert client.exists(lock.name, queue) == 2


def test_redis_down_is_a_one_line_error(run: Run) -> None:
    """With nothing listening on the lock Redis port, list and clear exit non-zero with one
    line naming the masked URL, and no traceback."""
    url = f"redis://:s3cret@127.0.0.1:{free_port()}/0"

    for args in (("list",), ("clear", "--all", "--yes")):
        done = run(*args, url=url)

        assert done.returncode != 0
        assert "Traceback" not in done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert "127.0.0.1" in lines[0]
        assert "s3cret" not in done.stderr + done.stdout


def test_bad_settings_show_the_improperly_configured_message(run: Run) -> None:
    """A bad ``singleton_lock_*`` setting is reported by name, without a traceback."""
    done = run("list", CSL_CLI_PREFIX="bad prefix")

    assert done.returncode != 0
    assert "singleton_lock_prefix" in done.stderr
    assert "Traceback" not in done.stderr
