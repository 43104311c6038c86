"""``celery -A proj locks check`` run as a real ``celery`` subprocess against private
redis-servers configured to fail each check: eviction policy, scripting disabled by ACL and
by ``rename-command``, an ACL user missing a command; and its exit statuses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from celery_singleton_lock.testing import RedisServer, free_port

ROOT = Path(__file__).resolve().parents[2]


def check(url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``celery -A tests.cli.cliproj locks check ARGS`` against ``url``."""
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "CSL_CLI_URL": url,
               "CSL_CLI_PREFIX": f"chk-{uuid.uuid4().hex[:8]}", **env}  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.cli.cliproj", "locks", "check", *args],
        cwd=ROOT, env=environ, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=240, check=False,
    )  # fmt: skip


def lines(done: subprocess.CompletedProcess[str]) -> dict[str, tuple[str, str]]:
    """The report's check lines as name -> (status mark, detail)."""
    found = {}
    for line in done.stdout.splitlines()[1:-1]:
        mark, name, detail = line.split(None, 2)
        found[name] = (mark, detail)
    return found


@pytest.fixture
def admin(fresh_server: RedisServer) -> Iterator[redis.Redis]:
    """The default (all-powerful) user of a server of this test's own."""
    client = redis.Redis.from_url(fresh_server.url, decode_responses=True)
    yield client
    client.close()


def test_a_healthy_server_passes_every_check(fresh_server: RedisServer) -> None:
    """On a default redis-server every check is ok and the exit status is 0."""
    done = check(fresh_server.url)
    assert done.returncode == 0, done.stdout + done.stderr
    found = lines(done)
    assert set(found) == {
        "server",
        "eviction",
        "scripting",
        "clock",
        "durability",
        "permissions",
        "admin",
    }
    assert all(mark == "ok" for mark, _ in found.values()), done.stdout
    assert found["server"][1].startswith(("Redis ", "Valkey "))
    assert "noeviction" in found["eviction"][1]
    assert done.stdout.rstrip().endswith("0 failures, 0 warnings")


def test_an_evicting_policy_fails_with_maxmemory_and_warns_without(
    fresh_server: RedisServer, admin: redis.Redis
) -> None:
    """allkeys-lru with a maxmemory limit fails (exit 1); without a limit it only warns
    (exit 0), and --strict turns that warning into exit 1."""
    admin.config_set("maxmemory-policy", "allkeys-lru")
    warned = check(fresh_server.url)
    strict = check(fresh_server.url, "--strict")
    admin.config_set("maxmemory", "100mb")
    failed = check(fresh_server.url)

    assert warned.returncode == 0, warned.stdout + warned.stderr
    assert lines(warned)["eviction"][0] == "WARN"
    assert strict.returncode == 1
    assert failed.returncode == 1
    mark, detail = lines(failed)["eviction"]
    assert mark == "FAIL"
    assert "allkeys-lru" in detail
    assert "noeviction" in detail


def test_scripting_renamed_away_fails_unless_plain_commands_are_configured() -> None:
    """With EVALSHA renamed away (rename-command) scripted locks fail the check; with
    singleton_lock_scripting=False the same server passes."""
    with RedisServer(extra_args=("--rename-command", "EVALSHA", "")) as server:
        scripted = check(server.url)
        plain = check(server.url, CSL_CLI_SCRIPTING="0")
    assert scripted.returncode == 1
    found = lines(scripted)
    assert found["scripting"][0] == "FAIL"
    assert "singleton_lock_scripting = False" in found["scripting"][1]
    assert found["permissions"][0] == "FAIL"
    assert "EVALSHA (unknown command" in found["permissions"][1]
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert lines(plain)["scripting"][0] == "ok"
    assert "plain-command locks use is allowed" in lines(plain)["permissions"][1]


def test_an_acl_user_missing_commands_fails_naming_them(
    fresh_server: RedisServer, admin: redis.Redis
) -> None:
    """An ACL user without PEXPIRE and EVALSHA fails permissions (and scripting), naming
    each missing command; one without SCAN only warns that `locks list` needs it."""
    admin.acl_setuser("locker", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"],
                      commands=["+@all", "-pexpire", "-evalsha"])  # fmt: skip
    admin.acl_setuser("lister", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"],
                      commands=["+@all", "-scan"])  # fmt: skip
    port = fresh_server.port
    locker = check(f"redis://locker:pw@127.0.0.1:{port}/0")
    lister = check(f"redis://lister:pw@127.0.0.1:{port}/0")

    assert locker.returncode == 1
    found = lines(locker)
    assert found["permissions"][0] == "FAIL"
    assert "PEXPIRE (not permitted by the ACL)" in found["permissions"][1]
    assert "EVALSHA (not permitted by the ACL)" in found["permissions"][1]
    assert "GET" not in found["permissions"][1].split(": ", 1)[1]
    assert found["scripting"][0] == "FAIL"
    assert "pw@" not in locker.stdout
    assert lister.returncode == 0, lister.stdout + lister.stderr
    assert lines(lister)["admin"] == ("WARN", "`celery locks list/clear` need SCAN (not "
                                      "permitted by the ACL) (tasks do not)")  # fmt: skip
    assert lines(lister)["permissions"][0] == "ok"


def test_json_report_and_unreachable_and_bad_settings(fresh_server: RedisServer) -> None:
    """--json prints every check as an object; an unreachable Redis exits 69 and a bad
    singleton_lock_* setting exits 78, each with a one-line message."""
    as_json = check(fresh_server.url, "--json")
    down = check(f"redis://127.0.0.1:{free_port()}/0")
    bad = check(fresh_server.url, CSL_CLI_PREFIX="has space")

    assert as_json.returncode == 0, as_json.stderr
    report = json.loads(as_json.stdout)
    assert (report["failures"], report["warnings"]) == (0, 0)
    assert [item["name"] for item in report["checks"]] == [
        "server", "eviction", "scripting", "clock", "durability", "permissions", "admin",
    ]  # fmt: skip
    assert all(item["status"] == "ok" for item in report["checks"])
    assert down.returncode == 69
    assert "unreachable" in down.stderr
    assert bad.returncode == 78
    assert "singleton_lock_prefix" in bad.stderr


def test_a_parking_task_on_a_server_without_persistence_is_warned_about(
    fresh_server: RedisServer, admin: redis.Redis
) -> None:
    """A task parks (its calls live only in the lock Redis): without an append-only file or
    a replica the durability check warns, naming the task; with appendonly on it is ok."""
    admin.config_set("appendonly", "no")
    admin.config_set("save", "")
    warned = check(fresh_server.url, CSL_CLI_PARK="1")
    admin.config_set("save", "3600 1")
    snapshots = check(fresh_server.url, CSL_CLI_PARK="1")
    admin.config_set("appendonly", "yes")
    durable = check(fresh_server.url, CSL_CLI_PARK="1")
    admin.config_set("appendonly", "no")

    assert warned.returncode == 0, warned.stdout + warned.stderr
    mark, detail = lines(warned)["durability"]
    assert mark == "WARN"
    assert "shop.reserve" in detail
    assert "a restart loses every call set aside" in detail
    assert "since the last one" in lines(snapshots)["durability"][1]
    assert lines(durable)["durability"][0] == "ok", durable.stdout
    assert lines(check(fresh_server.url))["durability"][0] == "ok"  # no task parks
