"""The permission probes of ``celery locks check`` on a real redis-server: every command
the engine uses passes for an all-powerful user, and an ACL user refused any one of them
fails naming that command alone, in the mode that needs it; probing leaves no key behind."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from celery_singleton_lock.engine import scripts
from celery_singleton_lock.ops import checks
from celery_singleton_lock.testing import RedisServer

#: Commands an ACL user can be refused one at a time without the probes of others failing
#: (SET, GET, DEL, ... build the keys every other probe acts on).
ALONE = sorted(
    (checks.needed_commands(True) | checks.needed_commands(False))
    - {"PING", "SET", "GET", "DEL", "SCRIPT LOAD", "EVALSHA", "TIME"}
)


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    """A redis-server of its own: its ACL users are this module's."""
    with RedisServer() as started:
        yield started


def _user(server: RedisServer, name: str, *refused: str) -> redis.Redis:
    admin = redis.Redis.from_url(server.url)
    commands = ["+@all", *(f"-{command.lower()}" for command in refused)]
    admin.acl_setuser(name, enabled=True, passwords=["+pw"], keys=["*"], channels=["*"],
                      commands=commands)  # fmt: skip
    admin.close()
    return redis.Redis(host="127.0.0.1", port=server.port, username=name, password="pw")


@pytest.mark.parametrize("scripting", [True, False], ids=["scripted", "plain"])
def test_every_probe_passes_for_a_user_allowed_everything(
    server: RedisServer, scripting: bool
) -> None:
    """The default user passes every probe of both modes, and the probe keys are gone."""
    client = redis.Redis.from_url(server.url)
    permissions, admin = checks._permissions(client, "probe", scripting)
    assert (permissions.status, admin.status) == (checks.OK, checks.OK), permissions.detail
    assert client.keys("probe:*") == []
    client.close()


@pytest.mark.parametrize("command", ALONE)
def test_a_refused_command_is_named_alone(server: RedisServer, command: str) -> None:
    """A user refused ``command`` fails permissions naming it, and only it, in each mode
    whose locks use it; a mode that does not use it passes."""
    client = _user(server, f"no-{command.lower()}", command)
    for scripting in (True, False):
        permissions, _ = checks._permissions(client, "probe", scripting)
        if command in checks.needed_commands(scripting):
            assert permissions.status == checks.FAIL
            assert permissions.detail.split(": ", 1)[1] == f"{command} (not permitted by the ACL)"
        else:
            assert permissions.status == checks.OK, permissions.detail
    client.close()


def test_the_modes_commands_are_probed(server: RedisServer) -> None:
    """The commands only the modes' scripts use are among those probed (scripted)."""
    client = _user(server, "no-modes", "hset", "hmget", "zremrangebyscore", "mget", "wait")
    permissions, _ = checks._permissions(client, "probe", True)
    for command in ("HSET", "HMGET", "ZREMRANGEBYSCORE", "MGET", "WAIT"):
        assert f"{command} (not permitted by the ACL)" in permissions.detail
    assert {"HSET", "HMGET", "ZREMRANGEBYSCORE", "MGET"} <= scripts.commands()
    client.close()
