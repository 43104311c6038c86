"""What docs/operations.md says about ``celery locks`` errors, checked on the real command:
exit status 77 when the lock Redis refuses the user (a command its ACL lacks, a wrong
password), 69 when it is unreachable, 1 for a bad setting, and ``locks key`` refusing
arguments that do not fit the task unless ``lock_keys`` does not use the missing ones.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from celery_singleton_lock.testing import RedisServer, free_port

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def locks(url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``celery -A tests.cli.cliproj locks ARGS...`` with ``url`` as its broker and lock
    Redis."""
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "CSL_CLI_URL": url, **env}
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.cli.cliproj", "locks", *args],
        cwd=ROOT, env=environ, capture_output=True, text=True, timeout=120, check=False,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as running:
        admin = redis.Redis.from_url(running.url)
        admin.acl_setuser("noscan", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"],
                          commands=["+@all", "-scan"])  # fmt: skip
        admin.close()
        yield running


def _as(server: RedisServer, user: str, password: str) -> str:
    return f"redis://{user}:{password}@127.0.0.1:{server.port}/0"


def test_a_refused_command_exits_77(server: RedisServer) -> None:
    """``locks list`` as a user whose ACL lacks SCAN: EX_NOPERM, not "unreachable"."""
    done = locks(_as(server, "noscan", "pw"), "list")
    assert done.returncode == 77, done.stdout + done.stderr
    assert "refused this user" in done.stderr
    assert "scan" in done.stderr.lower()
    assert ":pw@" not in done.stderr


@pytest.mark.parametrize("command", [("list",), ("check",), ("clear", "--all", "--yes")])
def test_a_wrong_password_exits_77(server: RedisServer, command: tuple[str, ...]) -> None:
    done = locks(_as(server, "noscan", "wrong"), *command)
    assert done.returncode == 77, done.stdout + done.stderr
    assert "wrong" not in done.stderr.replace("WRONGPASS", "")


@pytest.mark.parametrize("command", [("list",), ("check",)])
def test_an_unreachable_redis_exits_69(command: tuple[str, ...]) -> None:
    done = locks(f"redis://u:secret@127.0.0.1:{free_port()}/0", *command)
    assert done.returncode == 69, done.stdout + done.stderr
    assert "secret" not in done.stdout + done.stderr


def test_a_bad_setting_exits_1_and_78_for_check(server: RedisServer) -> None:
    """A bad ``singleton_lock_*`` setting: exit 1 with its message, 78 for ``check``."""
    bad = {"CSL_CLI_PREFIX": "has space"}
    listed = locks(server.url, "list", **bad)
    checked = locks(server.url, "check", **bad)
    assert listed.returncode == 1, listed.stdout + listed.stderr
    assert "singleton_lock_prefix" in listed.stderr
    assert checked.returncode == 78, checked.stdout + checked.stderr


@pytest.mark.parametrize(
    ("arguments", "status"),
    [
        (('["sku-1", 7]',), 0),
        (("[]", '{"sku": "sku-1", "user_id": 7}'), 0),
        (('["sku-1"]',), 0),  # user_id left out: lock_keys=["sku"] does not use it
        (("[]", '{"user_id": 7}'), 2),  # sku is what the key is made of
        (('["sku-1", 7, 8]',), 2),  # too many: the call fails
        (('["sku-1"]', '{"coupon": 1}'), 2),  # an unknown keyword: the call fails
    ],
)
def test_key_refuses_arguments_that_do_not_fit(
    server: RedisServer, arguments: tuple[str, ...], status: int
) -> None:
    """``locks key`` prints a key only for arguments a call could have: all of them, or
    all but those ``lock_keys`` does not use; anything else exits 2 and prints no key."""
    done = locks(server.url, "key", "shop.buy", *arguments)
    assert done.returncode == status, done.stdout + done.stderr
    if status:
        assert done.stdout == ""
        assert "do not fit shop.buy(sku, user_id)" in done.stderr
    else:
        full = locks(server.url, "key", "shop.buy", '["sku-1", 7]')
        assert done.stdout == full.stdout
