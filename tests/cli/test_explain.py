"""``celery -A proj locks explain TASK [ARGS...] [--kwargs JSON] [--json]`` run as the real
``celery`` command against a private Redis (issue 25): the key of the call as ``locks key``
computes it, and each state a key can be in (free, held with waiters in turn order, parked
calls with their positions and a pending follow-up, debouncing with its due time,
throttled with its next free start, slots) taken the way tasks take them."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from celery_singleton_lock import LockedTask, RedisLock
from celery_singleton_lock.engine import atomic
from celery_singleton_lock.engine.keyspace import companion_key
from celery_singleton_lock.explain import Explanation
from celery_singleton_lock.testing import RedisServer, free_port

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.cli.explainproj"

Cli = Callable[..., "subprocess.CompletedProcess[str]"]

#: The top-level fields of ``--json``.
FIELDS = {
    "key", "task", "state", "states", "now", "slots", "holders", "waiters", "waiting",
    "parked", "parked_total", "handed", "follow_up", "throttle", "debounce", "limits",
}  # fmt: skip
HOLDER_FIELDS = {
    "key", "slot", "state", "task_id", "task", "host", "pid", "since", "age", "lease_left",
    "lease", "renewed", "fence",
}  # fmt: skip


def _environ(server: RedisServer, prefix: str, url: str | None = None) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "CSL_CLI_URL": url or server.url,
        "CSL_CLI_PREFIX": prefix,
    }


@pytest.fixture
def cli(redis_server: RedisServer, prefix: str) -> Cli:
    """Run ``celery -A tests.cli.explainproj locks ARGS...``."""

    def run(*args: str, url: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "celery", "-A", APP, "locks", *args],
            cwd=ROOT, env=_environ(redis_server, prefix, url), stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=240, check=False,
        )  # fmt: skip

    return run


@pytest.fixture
def publish(redis_server: RedisServer, prefix: str) -> Callable[[str], Any]:
    """Run ``code`` in a producer process of its own (as a web app would) and return what
    it prints, read as JSON."""

    def run(code: str) -> Any:
        done = subprocess.run(
            [sys.executable, "-c", f"import json\nfrom {APP} import *\n{code}"],
            cwd=ROOT, env=_environ(redis_server, prefix), capture_output=True, text=True,
            timeout=240, check=True,
        )  # fmt: skip
        return json.loads(done.stdout)

    return run


def _key(cli: Cli, task: str, args: list[Any]) -> str:
    done = cli("key", task, json.dumps(args))
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _explain(cli: Cli, *args: str) -> dict[str, Any]:
    done = cli("explain", *args, "--json")
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout)
    assert set(found) == FIELDS
    return found


def _lines(cli: Cli, *args: str) -> dict[str, list[str]]:
    """The text output as {label: [lines]} (a line without a label continues the last)."""
    done = cli("explain", *args)
    assert done.returncode == 0, done.stderr
    found: dict[str, list[str]] = {}
    label = ""
    for line in done.stdout.splitlines():
        text = line
        if not line.startswith(" "):
            label, _, text = line.partition(" ")
        found.setdefault(label, []).append(text.strip())
    return found


def test_a_free_key_as_text_and_json(cli: Cli, client: redis.Redis) -> None:
    """Nobody holds the key: state free. The key is the one ``locks key`` prints for the
    same call, whether an argument is positional, given with --kwargs, or negative."""
    key = _key(cli, "shop.buy", ["sku-1", 7])
    assert _lines(cli, "shop.buy", '"sku-1"', "7") == {
        "Key": [key],
        "State": ["free"],
        "Holder": ["nobody"],
    }
    before = _server_s(client)
    found = _explain(cli, "shop.buy", '"sku-1"', "--kwargs", '{"user_id": 7}')
    after = _server_s(client)
    assert found["key"] == key
    assert before <= found["now"] <= after  # the server's clock, read while it explained
    assert {name: value for name, value in found.items() if name != "now"} == {
        "key": key,
        "task": "shop.buy",
        "state": "free",
        "states": [],
        "slots": {"limit": 1, "held": 0},
        "holders": [],
        "waiters": [],
        "waiting": 0,
        "parked": [],
        "parked_total": 0,
        "handed": [],
        "follow_up": None,
        "throttle": None,
        "debounce": None,
        "limits": [],
    }
    negative = _explain(cli, "shop.export", "-5")  # an option-like argument is a value
    assert negative["key"] == _key(cli, "shop.export", [-5])


def _take(lock: RedisLock) -> None:
    """Wait for ``lock`` (as a ``wait`` run does) and give it back at once."""
    if lock.acquire(timeout=30):
        lock.release()


@pytest.fixture
def threads() -> Iterator[list[threading.Thread]]:
    started: list[threading.Thread] = []
    yield started
    for thread in started:
        thread.join(timeout=30)


def test_the_holder_and_the_waiters_in_turn_order(
    cli: Cli, client: redis.Redis, threads: list[threading.Thread]
) -> None:
    """A run holds the key and two wait for it: the holder with its task id, host/pid,
    age, lease left and fencing token, the waiters at positions 1 and 2 in the order they
    came."""
    key = _key(cli, "shop.buy", ["sku-2", 1])
    info = {"task_id": "t-holder", "task": "shop.buy", "host": "box-1", "pid": 4242}
    holder = RedisLock(client, key, timeout=600.0, holder_info=info)
    assert holder.acquire(blocking=False)
    try:
        for number in (1, 2):
            waiter_info = {"task_id": f"t-wait-{number}", "task": "shop.buy", "host": "box-2",
                           "pid": 10 + number}  # fmt: skip
            waiter = RedisLock(client, key, timeout=600.0, holder_info=waiter_info)
            threads.append(threading.Thread(target=_take, args=(waiter,), daemon=True))
            threads[-1].start()
            assert _wait(functools.partial(_queued, client, key, number))
        found = _explain(cli, "shop.buy", '"sku-2"', "1")
        assert (found["state"], found["states"]) == ("held", ["held"])
        (held,) = found["holders"]
        assert set(held) == HOLDER_FIELDS
        assert held["key"] == key
        assert held["slot"] == 1
        assert held["state"] == "running"
        assert (held["task_id"], held["task"], held["host"], held["pid"]) == (
            "t-holder", "shop.buy", "box-1", 4242
        )  # fmt: skip
        assert held["fence"] == holder.fencing_token
        assert held["since"] == pytest.approx(held["fence"] / 1e6)
        # what is left of the 600 s lease taken at "since", by the server's clock
        assert held["lease_left"] == pytest.approx(held["since"] + 600 - found["now"], abs=0.01)
        assert held["lease"] == 600.0
        assert held["renewed"] is None
        assert found["waiting"] == 2
        assert [(w["position"], w["task_id"], w["host"], w["pid"]) for w in found["waiters"]] == [
            (1, "t-wait-1", "box-2", 11),
            (2, "t-wait-2", "box-2", 12),
        ]
        text = _lines(cli, "shop.buy", '"sku-2"', "1")
        (holder_line,) = text["Holder"]
        assert holder_line.startswith("shop.buy[t-holder] on box-1/4242: running for ")
        assert ", not renewed yet, " in holder_line
        assert holder_line.endswith(f", fence {holder.fencing_token}")
        waiting = text["Waiters"]
        assert waiting[0] == "2 waiting, in turn order"
        assert waiting[1].startswith("1. shop.buy[t-wait-1] on box-2/11, waiting ")
        assert waiting[2].startswith("2. shop.buy[t-wait-2] on box-2/12, waiting ")
    finally:
        holder.release()


def _queued(client: redis.Redis, key: str, count: int) -> bool:
    return int(client.zcard(companion_key(key, "queue"))) == count


def _server_s(client: redis.Redis) -> float:
    """The server's clock, in seconds (the clock explain reports on)."""
    seconds, micros = client.time()  # type: ignore[misc]
    return int(seconds) + int(micros) / 1e6


def _wait(check: Callable[[], bool], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_an_expired_hold_and_a_lapsed_waiter(cli: Cli, client: redis.Redis) -> None:
    """A hold whose lease ended while its key is still there (a crashed run): the key is
    free, the hold listed as expired. A waiter whose place lapsed (it gave up) is passed
    over, as a release passes it over, and not counted."""
    key = _key(cli, "shop.buy", ["sku-4", 1])
    info = {"task_id": "t-crashed", "task": "shop.buy", "host": "box-1", "pid": 99}
    crashed = RedisLock(client, key, timeout=0.2, holder_info=info)
    assert crashed.acquire(blocking=False)
    taken = _server_s(client)
    crashed.detach()  # never released: its key outlives its lease by a grace period,
    assert client.pexpire(key, 600_000)  # here long enough for two commands, however slow
    # until the 0.2 s lease has ended by the server's clock (bounded: 60 s)
    assert _wait(lambda: _server_s(client) > taken + 0.2, timeout=60)
    found = _explain(cli, "shop.buy", '"sku-4"', "1")
    assert (found["state"], found["states"]) == ("free", [])
    (held,) = found["holders"]
    assert (held["task_id"], held["state"], held["lease_left"]) == ("t-crashed", "expired", None)
    assert found["slots"] == {"limit": 1, "held": 0}
    (line,) = _lines(cli, "shop.buy", '"sku-4"', "1")["Holder"]
    assert line.startswith("shop.buy[t-crashed] on box-1/99: expired (taken ")
    assert "its lease ended: the next call takes the key over" in line

    holder = RedisLock(client, key, timeout=600.0, holder_info={**info, "task_id": "t-now"})
    assert holder.acquire(blocking=False)
    try:
        client.zadd(companion_key(key, "queue"), {"gone": 1, "here": 2})
        client.set(companion_key(key, "waiter:here"), '30000:{"task_id": "t-here"}', px=30_000)
        found = _explain(cli, "shop.buy", '"sku-4"', "1")
        assert found["waiting"] == 1
        assert [(w["position"], w["task_id"]) for w in found["waiters"]] == [(1, "t-here")]
        assert Explanation.from_json(found).as_json() == found
    finally:
        holder.release()


def test_parked_calls_with_positions_and_a_pending_follow_up(
    cli: Cli, publish: Callable[[str], Any]
) -> None:
    """Queue scope: a call holds the key (queued, its message not started) and three more
    parked at publish, listed 1 to 3 as they came; under coalesce, a call made while one
    is queued is the key's pending follow-up."""
    ids = publish("print(json.dumps([restock.delay('sku-9', n).id for n in range(4)]))")
    found = _explain(cli, "shop.restock", '"sku-9"', "0")
    assert found["states"] == ["held", "parked"]
    assert [(h["task_id"], h["state"]) for h in found["holders"]] == [(ids[0], "queued")]
    assert found["parked_total"] == 3
    assert [(p["position"], p["task_id"], p["task"]) for p in found["parked"]] == [
        (1, ids[1], "shop.restock"),
        (2, ids[2], "shop.restock"),
        (3, ids[3], "shop.restock"),
    ]
    text = _lines(cli, "shop.restock", '"sku-9"', "0")
    assert text["Parked"][0] == "3 parked, in turn order"
    assert text["Parked"][1].startswith(f"1. shop.restock[{ids[1]}], parked ")

    first, second = publish("print(json.dumps([report.delay('mon').id, report.delay('tue').id]))")
    follow = _explain(cli, "shop.report", '"wed"')
    assert follow["states"] == ["held"]
    assert [(h["task_id"], h["state"]) for h in follow["holders"]] == [(first, "queued")]
    assert follow["follow_up"] is not None
    assert follow["follow_up"]["task_id"] == second
    (line,) = _lines(cli, "shop.report", '"wed"')["Follow-up"]
    assert line.startswith(f"shop.report[{second}], called on ")
    assert line.endswith(": runs when the holder ends")


def test_a_debounce_burst_and_its_due_time(
    cli: Cli, publish: Callable[[str], Any], client: redis.Redis
) -> None:
    """Two calls 30 s apart at most form one burst: debouncing, two calls, due 30 s after
    the last (the bodies never run: no worker). Times on the server's clock: the last call
    was made between ``before`` and ``after``."""
    before = _server_s(client)
    ids = publish("print(json.dumps([reindex.delay('s1').id, reindex.delay('s1').id]))")
    after = _server_s(client)
    assert ids[0] == ids[1]  # every call of a burst gets its task id
    found = _explain(cli, "shop.reindex", '"s1"')
    assert (found["state"], found["states"]) == ("debouncing", ["debouncing"])
    burst = found["debounce"]
    assert (burst["task_id"], burst["calls"], burst["state"]) == (ids[0], 2, "open")
    assert before + 30 - 0.002 <= burst["due"] <= after + 30 + 0.002  # ms rounding
    assert burst["due"] == pytest.approx(found["now"] + burst["due_in"], abs=0.01)
    assert burst["first_call"] <= found["now"]
    (line,) = _lines(cli, "shop.reindex", '"s1"')["Debounce"]
    assert line.startswith(f"[{ids[0]}] 2 calls, runs in ")


def test_a_throttled_key_and_its_next_free_start(cli: Cli, client: redis.Redis) -> None:
    """Two starts recorded in the window of a "2/m" key (as two runs record them):
    throttled, 2 of 2, the next start free about a minute later."""
    key = _key(cli, "shop.sync", ["acme"])
    before = _server_s(client)
    for run in ("run-1", "run-2"):
        assert atomic.throttle(client, key, limit=2, window_ms=60_000, member=run) is None
    after = _server_s(client)
    found = _explain(cli, "shop.sync", '"acme"')
    assert (found["state"], found["states"]) == ("throttled", ["throttled"])
    throttle = found["throttle"]
    assert {name: throttle[name] for name in ("rate", "limit", "window", "count")} == {
        "rate": "2/m", "limit": 2, "window": 60.0, "count": 2
    }  # fmt: skip
    # the next free start: a minute after run-1's start (server clock, ms rounding)
    frees = found["now"] + throttle["next_start_in"]
    assert before + 60 - 0.002 <= frees <= after + 60 + 0.002
    (line,) = _lines(cli, "shop.sync", '"acme"')["Throttle"]
    assert line.startswith("2 of 2 starts (2/m) in the last 60s; next free start in ")
    other = _explain(cli, "shop.sync", '"globex"')  # another key, another window
    assert other["state"] == "free"
    assert other["throttle"]["count"] == 0
    assert other["throttle"]["next_start_in"] == 0


def test_two_of_three_slots(cli: Cli, client: redis.Redis) -> None:
    """Two holds of a ``lock_limit=3`` key: 2 of 3 held, one holder per slot."""
    key = _key(cli, "shop.export", [42])
    holds = []
    for number in (1, 2):
        info = {"task_id": f"t-export-{number}", "task": "shop.export", "host": "box", "pid": 7}
        lock = RedisLock(client, key, timeout=600.0, holder_info=info, limit=3)
        assert lock.acquire(blocking=False)
        holds.append(lock)
    try:
        found = _explain(cli, "shop.export", "42")
        assert found["slots"] == {"limit": 3, "held": 2}
        assert sorted((h["slot"], h["task_id"]) for h in found["holders"]) == [
            (1, "t-export-1"),
            (2, "t-export-2"),
        ]
        assert found["holders"][1]["key"] == companion_key(key, "slot:2")
        text = _lines(cli, "shop.export", "42")
        assert text["Slots"] == ["2 of 3 held"]
        assert [line.split("]")[0] for line in text["Holder"]] == [
            "slot 1: shop.export[t-export-1",
            "slot 2: shop.export[t-export-2",
        ]
    finally:
        for lock in holds:
            lock.release()


def test_lock_explain_of_a_task_locked_by_config_and_of_a_locked_task(
    redis_server: RedisServer, prefix: str, client: redis.Redis, cli: Cli
) -> None:
    """``task.lock_explain()`` is on tasks locked through ``singleton_lock_tasks`` too, and
    says what the command says for the same call."""
    app = Celery("legacy", broker=redis_server.url, set_as_current=False)
    app.conf.update(
        singleton_lock_url=redis_server.url,
        singleton_lock_prefix=prefix,
        singleton_lock_tasks={"legacy.*": {"lock_keys": ["order"], "lock_timeout": 20}},
    )

    @app.task(name="legacy.ship", shared=False)
    def ship(order: int, carrier: str) -> None: ...

    @app.task(name="shop.buy", shared=False, base=LockedTask, lock_keys=["sku"],
              lock_timeout=600.0)  # fmt: skip
    def buy(sku: str, user_id: int) -> None: ...

    app.finalize()  # singleton_lock_tasks annotates the tasks as the app is finalized
    assert ship.lock_explain(7, "ups").state == "free"
    info = {"task_id": "t-ship", "task": "legacy.ship", "host": "box", "pid": 3}
    held = RedisLock(client, ship.lock_key(7, "ups"), timeout=20.0, holder_info=info)
    assert held.acquire(blocking=False)
    try:
        explanation = ship.lock_explain(7, "dhl")  # lock_keys: the same key
        assert (explanation.key, explanation.task) == (held.name, "legacy.ship")
        assert explanation.holder is not None
        assert (explanation.holder.task_id, explanation.holder.lease) == ("t-ship", 20.0)
    finally:
        held.release()

    info = {"task_id": "t-buy", "task": "shop.buy", "host": "box", "pid": 4}
    held = RedisLock(client, buy.lock_key("sku-5", 1), timeout=600.0, holder_info=info)
    assert held.acquire(blocking=False)
    try:
        mine = buy.lock_explain("sku-5", 2).as_json()
        shown = _explain(cli, "shop.buy", '"sku-5"', "2")
        timing = {"now", "since", "age", "lease_left"}
        assert {k: v for k, v in mine.items() if k not in timing | {"holders"}} == {
            k: v for k, v in shown.items() if k not in timing | {"holders"}
        }
        assert [{k: v for k, v in h.items() if k not in timing} for h in mine["holders"]] == [
            {k: v for k, v in h.items() if k not in timing} for h in shown["holders"]
        ]
    finally:
        held.release()


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (("shop.buy", "sku-1", "7"), 2, "Invalid value for ARGS: argument 1 ('sku-1') is not "
         "valid JSON"),
        (("shop.buy", '"sku-1"', "--kwargs", "[7]"), 2, "Invalid value for --kwargs: must be "
         "a JSON object"),
        (("shop.bye", '"sku-1"'), 2, "Invalid value for TASK: unknown task 'shop.bye'; did "
         "you mean 'shop.buy',"),
        (("shop.buy",), 2, "Invalid value for ARGS / --kwargs: these arguments do not fit "
         "shop.buy(sku, user_id)"),
        (("shop.ping",), 1, "task 'shop.ping' is not locked"),
    ],
)  # fmt: skip
def test_arguments_are_checked_as_locks_key_checks_them(
    cli: Cli, args: tuple[str, ...], status: int, message: str
) -> None:
    """Arguments that are not JSON, do not fit the task's signature, or name a task that
    is unknown or not locked: the usage error (status 2) or error (status 1) of
    ``locks key``, and nothing is read."""
    done = cli("explain", *args)
    assert done.returncode == status, done.stdout
    assert message in " ".join(done.stderr.split())
    assert done.stdout == ""


def test_a_left_out_argument_that_lock_keys_does_not_use(cli: Cli) -> None:
    """As ``locks key``: an argument ``lock_keys`` does not use may be left out (a note
    says so), and the key is the same."""
    done = cli("explain", "shop.buy", '"sku-3"')
    assert done.returncode == 0, done.stderr
    assert "note: user_id left out" in done.stderr
    assert done.stdout.split()[1] == _key(cli, "shop.buy", ["sku-3", 1])


def test_an_unreachable_lock_redis(cli: Cli) -> None:
    """The lock Redis is down: status 69, one line."""
    done = cli("explain", "shop.buy", '"sku-1"', "7", url=f"redis://127.0.0.1:{free_port()}/0")
    assert done.returncode == 69, done.stderr
    assert "lock Redis at redis://127.0.0.1:" in done.stderr


def test_a_weight_callable_that_raises_is_named_and_the_rest_explained(
    redis_server: RedisServer, prefix: str, client: redis.Redis, cli: Cli
) -> None:
    """Issue 31 finding 6: ``lock_weight`` raises for this call (10 // 0). ``locks explain``
    still explains the key (exit 0): a holder is listed, the stacked limit with its use and
    no weight, and a ``weight_error`` (a ``Weight`` line in text) names the failure; a call
    whose weight works explains as before. ``task.lock_explain()`` says the same."""
    key = _key(cli, "shop.bulk", ["acme", 0])
    info = {"task_id": "t-bulk", "task": "shop.bulk", "host": "box", "pid": 5}
    held = RedisLock(client, key, timeout=600.0, holder_info=info)
    assert held.acquire(blocking=False)
    try:
        done = cli("explain", "shop.bulk", '"acme"', "0", "--json")
        assert done.returncode == 0, done.stderr
        found = json.loads(done.stdout)
        assert set(found) == FIELDS | {"weight_error"}
        assert (
            found["weight_error"]
            == "lock_weight raised ZeroDivisionError: integer division or modulo by zero"
        )
        assert found["states"] == ["held"]
        assert [h["task_id"] for h in found["holders"]] == ["t-bulk"]
        ((use,),) = [found["limits"]]
        assert (use["name"], use["number"], use["used"], use["weight"], use["fits"]) == (
            "bulk:acme",
            4,
            0,
            None,
            None,
        )
        assert Explanation.from_json(found).as_json() == found
        text = _lines(cli, "shop.bulk", '"acme"', "0")
        assert text["Weight"] == ["unknown: " + found["weight_error"]]
        assert text["Holder"][0].startswith("shop.bulk[t-bulk] on box/5: running")
        assert text["Limit"][0].endswith("; this call's weight is unknown (lock_weight failed)")

        fine = _explain(cli, "shop.bulk", '"acme"', "5")  # weight 2: no weight_error field
        assert [(u["weight"], u["fits"]) for u in fine["limits"]] == [(2, True)]
    finally:
        held.release()

    app = Celery("weights", broker=redis_server.url, set_as_current=False)
    app.conf.update(singleton_lock_url=redis_server.url, singleton_lock_prefix=prefix)

    def weight(tenant: str, rows: int) -> int:
        raise RuntimeError("no rows table")

    @app.task(name="shop.bulk", shared=False, base=LockedTask, lock_keys=["tenant", "rows"],
              lock_limits=[("bulk:{tenant}", 4)], lock_weight=weight)  # fmt: skip
    def bulk(tenant: str, rows: int) -> None: ...

    explanation = bulk.lock_explain("acme", 0)
    assert explanation.state == "free"
    assert explanation.weight_error == "lock_weight raised RuntimeError: no rows table"
    assert [(use.name, use.weight, use.fits) for use in explanation.limits] == [
        ("bulk:acme", None, None)
    ]
