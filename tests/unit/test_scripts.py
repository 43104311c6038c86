"""The script registry (``engine.scripts``), pure: every ``.lua`` file is registered and
rendered (includes written in once, constants and key suffixes substituted), each Lua
helper is defined in one file only, the commands a script calls are derived exactly, and
``celery locks check`` has a probe for every command the engine uses."""

from __future__ import annotations

import re
from importlib import resources

import pytest
import redis

from celery_singleton_lock.engine import constants, scripts
from celery_singleton_lock.engine.keyspace import SUFFIXES
from celery_singleton_lock.engine.scripts import SCRIPTS, Script, commands, include
from celery_singleton_lock.ops import checks

FILES = resources.files("celery_singleton_lock.engine.scripts")
LUA = {entry.name: entry.read_text(encoding="utf-8") for entry in FILES.iterdir()
       if entry.name.endswith(".lua")}  # fmt: skip
LIB = {entry.name: entry.read_text(encoding="utf-8")
       for entry in FILES.joinpath("lib").iterdir()}  # fmt: skip
NAMES = {
    "acquire", "acquire_slots", "release", "extend", "throttle", "hold", "followup_call",
    "followup_hand_over", "followup_replace", "debounce_join", "debounce_run", "park",
    "park_release", "park_sweep", "park_started", "order_take", "order_turn", "order_leave",
    "index_drop", "stack_line", "held_park", "held_sweep", "held_started",
    "beat_claim", "beat_settle", "beat_presence",
}  # fmt: skip


def test_every_lua_file_is_a_registered_script() -> None:
    """One registered script per ``.lua`` file, named after it, with its SHA1."""
    assert set(SCRIPTS) == NAMES == {name.removesuffix(".lua") for name in LUA}
    for name, script in SCRIPTS.items():
        assert script.name == name
        assert len(script.sha) == 40


@pytest.mark.parametrize("name", sorted(NAMES))
def test_rendered_scripts_are_complete_lua(name: str) -> None:
    """A rendered script keeps its contract header first, has every include and
    placeholder written in, defines each helper at most once and carries no shebang (a
    ``#!lua`` line would change how Redis treats it at maxmemory)."""
    source = SCRIPTS[name].source
    assert source.startswith("-- ")
    assert "KEYS[1]" in source.split("\n\n")[0]
    assert "--@include" not in source
    assert "${" not in source
    assert "#!" not in source
    defined = re.findall(r"local function (\w+)", source)
    assert len(defined) == len(set(defined)), defined


def test_each_helper_is_written_once() -> None:
    """The clock conversion, the value builder and grammar, the owner match and the
    companion-key base live in one include each; no script derives a base by offsets or
    spells a suffix or a protocol constant itself."""

    def files_with(pattern: str) -> set[str]:
        found = {f"lib/{name}" for name, text in LIB.items() if re.search(pattern, text)}
        return found | {name for name, text in LUA.items() if re.search(pattern, text)}

    assert files_with(r"redis\.call\('TIME'\)") == {"lib/clock.lua"}
    assert files_with(r"\* 1000 \+ math\.floor") == {"lib/clock.lua"}
    assert files_with(r"local function format_value") == {"lib/value.lua"}
    assert files_with(r"\.\. ':' \.\. flag \.\. ':'") == {"lib/value.lua"}
    assert files_with(r"local function parse\(") == {"lib/value.lua"}
    assert files_with(r"'\^%d\+:") == {"lib/value.lua"}  # the value layout's pattern
    assert files_with(r"local function owned") == {"lib/owner.lua"}
    assert files_with(r"local function base\(") == {"lib/base.lua"}
    assert files_with(r"string\.sub\(KEYS") == set()
    assert files_with(r"GRACE_") == {"lib/lease.lua"}  # the TTL of a leased key
    for suffix in {value for value in SUFFIXES.values() if len(value) > 4}:
        assert files_with(f"'{re.escape(suffix)}'") == set(), suffix


def test_includes_are_rendered_with_constants_and_suffixes() -> None:
    """``include`` gives a helper with the Python constants and suffixes written in."""
    lease = include("lease")
    assert f"+ {constants.GRACE_BASE_MS} +" in lease
    assert f"/ {constants.GRACE_FRACTION})" in lease
    waiters = include("waiters")
    assert f"'{SUFFIXES['WAITER']}'" in waiters
    assert f"'{SUFFIXES['GRANT']}'" in waiters
    owner = include("owner")
    assert "local function parse(" in owner  # owner asks for value, written in first
    assert owner.index("local function fields(") < owner.index("local function owned(")


def test_commands_are_derived_from_the_source() -> None:
    """Each script's commands are what it calls, pcall included; all of them together
    are ``commands()``."""
    assert SCRIPTS["throttle"].commands == {
        "TIME", "ZREMRANGEBYSCORE", "ZCARD", "ZADD", "PEXPIRE", "ZRANGE",
    }  # fmt: skip
    assert SCRIPTS["debounce_run"].commands == {"ZSCORE", "GET", "SET"}
    assert {"SETRANGE", "ZADD", "PEXPIRE"} <= SCRIPTS["acquire"].commands  # via pcall
    assert "HEXISTS" not in SCRIPTS["followup_hand_over"].commands  # includes only it needs
    assert commands() == frozenset().union(*(s.commands for s in SCRIPTS.values()))
    assert {"HSET", "HMGET", "ZREMRANGEBYSCORE", "MGET"} <= commands()


def test_a_call_without_a_literal_command_is_refused() -> None:
    """A script whose command name is computed cannot be listed, so it is refused."""
    with pytest.raises(ValueError, match="literally"):
        Script("computed", "local c = 'GET' return redis.call(c, KEYS[1])")
    assert Script("named", "return redis.pcall('GET', KEYS[1]) -- redis.call(x)").commands == {
        "GET"
    }


def test_unknown_placeholder_fails_rendering() -> None:
    """A ``${NAME}`` nobody defines is an error, not Lua that fails on the server."""
    with pytest.raises(ValueError, match="NOPE"):
        scripts._substitute("return ${NOPE}", "test.lua")


@pytest.mark.parametrize("scripting", [True, False], ids=["scripted", "plain"])
def test_every_command_the_engine_uses_has_a_check_probe(scripting: bool) -> None:
    """``celery locks check`` probes every command the locks of each mode use (those of
    the registered scripts included) and the admin tools' own: a script that starts using
    a command without a probe fails here."""
    client = redis.Redis()  # never connects: the probes are only built, not run
    table = checks._probe_table(client, "prefix:check:{abc}")
    needed = checks.needed_commands(scripting)
    assert needed - set(table) == set()
    assert set(checks.ADMIN_COMMANDS) - set(table) == set()
    if scripting:
        assert commands() <= needed
        assert {"EVALSHA", "SCRIPT LOAD"} <= needed
    else:
        assert "EVALSHA" not in needed
    probed = [command for command, _, _ in checks._probes(client, "prefix:check:{abc}", scripting)]
    assert set(probed) == needed | set(checks.ADMIN_COMMANDS)
    assert probed[-1] == "DEL"  # the clean-up comes last
    client.close()
