"""``celery -A proj locks limit set|unset|list`` run as the real ``celery`` command against a
private Redis: numbers set and removed in the app's capacities hash; the list of limits from
the code and from Redis, with the live use of holds taken the way runs take them (expired
shares left out); the lookup order name -> template -> code, checked against what the
scripts let in; the typo warning; usage errors; JSON; masked passwords; and the sample of
docs/operations.md."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from celery_singleton_lock import RedisLock
from celery_singleton_lock.engine.stack import MAX_NAME, stack_base
from celery_singleton_lock.engine.wire import server_time
from celery_singleton_lock.ops.limits import (
    HEADINGS,
    CodeLimit,
    Usage,
    build_rows,
    closest,
    parse_number,
    renders,
    templates_of,
)
from celery_singleton_lock.runtime import locking_for
from celery_singleton_lock.testing import RedisServer, free_port
from tests.cli import limitsproj

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.cli.limitsproj"
EXPORT, AUDIT = "reports.export", "reports.audit"
#: How the docs show the URL and the prefix of the sample.
DOCS_URL, DOCS_PREFIX = "redis://127.0.0.1:6379/0", "csl"

Cli = Callable[..., "subprocess.CompletedProcess[str]"]
Take = Callable[..., RedisLock]


@pytest.fixture
def cli(redis_server: RedisServer, prefix: str) -> Cli:
    """Run ``celery -A tests.cli.limitsproj locks limit ARGS...`` (60 s at most)."""

    def run(*args: str, url: str | None = None) -> subprocess.CompletedProcess[str]:
        environ = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "CSL_CLI_URL": url or redis_server.url,
            "CSL_CLI_PREFIX": prefix,
        }
        return subprocess.run(
            [sys.executable, "-m", "celery", "-A", APP, "locks", "limit", *args],
            cwd=ROOT, env=environ, stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=240, check=False,
        )  # fmt: skip

    return run


@pytest.fixture
def app(redis_server: RedisServer, prefix: str) -> Celery:
    """The test project's app in this process, on this test's prefix."""
    return limitsproj.make_app(redis_server.url, prefix)


@pytest.fixture
def take(client: redis.Redis, app: Celery) -> Iterator[Take]:
    """``take(task, *args, timeout=600, **kwargs)``: hold the lock and the limit shares of a
    run of ``task`` with those arguments, as the worker takes them; released after. The
    lease outlasts any number of slow CLI calls (a 30 s one could end during a few of them
    on a loaded machine)."""
    held: list[RedisLock] = []

    def hold(task: str, *args: Any, timeout: float = 600.0, **kwargs: Any) -> RedisLock:
        found = app.tasks[task]
        locking = locking_for(found)
        assert locking is not None
        lock = RedisLock(
            client, locking.key(args, kwargs), timeout=timeout,
            stack=locking.stack(args, kwargs),
        )  # fmt: skip
        assert lock.acquire(blocking=False)
        held.append(lock)
        return lock

    yield hold
    for lock in held:
        with contextlib.suppress(Exception):
            lock.release()


def capacities(prefix: str) -> str:
    return stack_base(prefix) + "limits"


def table(output: str) -> dict[str, dict[str, str]]:
    """The rows of ``limit list`` by LIMIT, each cell by its heading."""
    lines = output.splitlines()
    assert re.split(r"\s{2,}", lines[1]) == list(HEADINGS), output
    rows = {}
    for line in lines[2:]:
        cells = re.split(r"\s{2,}", line)
        assert len(cells) == len(HEADINGS), line
        rows[cells[0]] = dict(zip(HEADINGS, cells, strict=True))
    return rows


def test_set_list_unset_round_trip(cli: Cli, client: redis.Redis, prefix: str) -> None:
    """``set`` writes the number into the capacities hash and says running work is never
    stopped; ``list`` shows it as SET and APPLIES beside the code's number; ``unset``
    removes it and says so, a second ``unset`` says nothing was set, and ``unset`` also
    removes a name written by hand that ``set`` would refuse."""
    done = cli("set", "tenant:7", "3")

    assert done.returncode == 0, done.stderr
    assert client.hget(capacities(prefix), "tenant:7") == b"3"
    assert done.stdout.startswith("Set limit 'tenant:7' to 3 on ")
    assert "running work is never stopped" in done.stdout
    assert "held back until they fit" in done.stdout
    assert done.stderr == ""  # a rendering of a known template: no warning

    listed = cli("list")
    assert listed.returncode == 0, listed.stderr
    assert f"'{capacities(prefix)}'" in listed.stdout.splitlines()[0]
    rows = table(listed.stdout)
    assert rows["tenant:7"] == {
        "LIMIT": "tenant:7", "CODE": "2", "SET": "3", "APPLIES": "3", "IN USE": "0",
        "HOLDS": "0", "TASKS": EXPORT,
    }  # fmt: skip
    assert rows["global:exports"]["TASKS"] == f"{AUDIT}, {EXPORT}"
    assert rows["tenant:{tenant}"]["IN USE"] == "-"  # a template is no limit itself
    assert "reports.ping" not in listed.stdout  # locked, but without limits

    gone = cli("unset", "tenant:7")
    again = cli("unset", "tenant:7")
    assert gone.returncode == 0, gone.stderr
    assert gone.stdout.startswith("Unset limit 'tenant:7' on ")
    assert client.hget(capacities(prefix), "tenant:7") is None
    assert again.returncode == 0, again.stderr
    assert "was not set" in again.stdout
    assert "nothing changed" in again.stdout
    assert "tenant:7" not in table(cli("list").stdout)  # neither set nor held
    client.hset(capacities(prefix), "tenant 7", "1")  # written by hand: set refuses it
    assert cli("unset", "tenant 7").returncode == 0
    assert client.exists(capacities(prefix)) == 0


def test_list_counts_the_live_shares_of_real_holds(
    cli: Cli, take: Take, client: redis.Redis, prefix: str
) -> None:
    """Holds taken as runs take them show in IN USE (their weights summed, a heavy export
    counting two) and HOLDS (how many), per rendered limit and in the global one."""
    take(EXPORT, "r1", "acme", heavy=True)
    take(EXPORT, "r2", "globex")
    take(EXPORT, "r3", "globex")
    take(AUDIT, "globex")

    rows = table(cli("list").stdout)

    assert (rows["tenant:acme"]["IN USE"], rows["tenant:acme"]["HOLDS"]) == ("2", "1")
    assert (rows["tenant:globex"]["IN USE"], rows["tenant:globex"]["HOLDS"]) == ("2", "2")
    assert (rows["global:exports"]["IN USE"], rows["global:exports"]["HOLDS"]) == ("5", "4")
    assert rows["tenant:acme"]["APPLIES"] == str(limitsproj.PER_TENANT)
    assert rows["global:exports"]["APPLIES"] == str(limitsproj.IN_ALL)
    assert list(rows) == sorted(rows)


def test_expired_shares_do_not_count(
    cli: Cli, take: Take, client: redis.Redis, prefix: str
) -> None:
    """A share whose lease ended on the server's clock (a crashed holder not yet pruned)
    is not counted, and ``list`` leaves it in place; a member of another layout counts as
    weight 1 while its score is ahead, as the scripts count it."""
    take(EXPORT, "r1", "acme")
    lapsed = take(EXPORT, "r2", "acme", timeout=0.5)
    shares = stack_base(prefix) + "limit:tenant:acme"
    member = f"1:{lapsed.token}"
    ends = client.zscore(shares, member)
    assert ends is not None
    deadline = time.monotonic() + 30
    while server_time(client)[0] <= ends:  # wait for the lease's end on the server clock
        assert time.monotonic() < deadline
        time.sleep(0.05)
    client.zadd(shares, {"odd-member": server_time(client)[0] + 600_000})

    rows = table(cli("list").stdout)

    assert (rows["tenant:acme"]["IN USE"], rows["tenant:acme"]["HOLDS"]) == ("2", "2")
    assert (rows["global:exports"]["IN USE"], rows["global:exports"]["HOLDS"]) == ("1", "1")
    assert client.zscore(shares, member) == ends  # read-only: pruning is the scripts' job


def test_a_template_set_applies_to_its_renderings_as_the_scripts_read_it(
    cli: Cli, take: Take, client: redis.Redis, app: Celery, prefix: str
) -> None:
    """A number set for a template applies to every rendering without one of its own and
    a number set by name wins over it; APPLIES shows what the scripts then let in."""
    take(EXPORT, "r1", "acme")
    assert cli("set", "tenant:{tenant}", "1").returncode == 0

    rows = table(cli("list").stdout)

    assert rows["tenant:{tenant}"]["SET"] == "1"
    assert rows["tenant:acme"] == {
        "LIMIT": "tenant:acme", "CODE": "2", "SET": "-", "APPLIES": "1", "IN USE": "1",
        "HOLDS": "1", "TASKS": EXPORT,
    }  # fmt: skip
    export = app.tasks[EXPORT]
    locking = locking_for(export)
    assert locking is not None
    second = RedisLock(
        client, locking.key(("r2", "acme"), {}), stack=locking.stack(("r2", "acme"), {})
    )
    assert not second.acquire(blocking=False)  # the template's 1 holds it back
    assert second.held_back_by == "tenant:acme"

    assert cli("set", "tenant:acme", "4").returncode == 0
    rows = table(cli("list").stdout)
    assert (rows["tenant:acme"]["SET"], rows["tenant:acme"]["APPLIES"]) == ("4", "4")
    assert rows["tenant:{tenant}"]["APPLIES"] == "1"
    assert second.acquire(blocking=False)  # the name's 4 lets it in
    second.release()


def test_a_name_no_task_reads_is_set_with_a_warning(
    cli: Cli, client: redis.Redis, prefix: str
) -> None:
    """A NAME that is neither a template of a registered task's lock_limits nor renders
    one (a typo) is still set, with a warning on stderr that suggests the closest rendering
    and names the known templates; a template or a rendering gets no warning."""
    typo = cli("set", "tenat:7", "3")
    mistyped = cli("set", "tenant:{tenantid}", "3")
    fixed = cli("set", "global:exports", "8")
    template = cli("set", "tenant:{tenant}", "4")

    assert typo.returncode == 0, typo.stderr
    assert client.hget(capacities(prefix), "tenat:7") == b"3"
    assert typo.stderr.startswith("warning: 'tenat:7' is neither")
    assert "did you mean 'tenant:7'?" in typo.stderr
    assert "known templates: 'global:exports', 'tenant:{tenant}'" in typo.stderr
    assert len(typo.stderr.strip().splitlines()) == 1
    assert typo.stdout.startswith("Set limit 'tenat:7' to 3")
    assert mistyped.returncode == 0, mistyped.stderr
    assert "did you mean 'tenant:{tenant}'?" in mistyped.stderr
    assert (fixed.returncode, fixed.stderr) == (0, "")
    assert (template.returncode, template.stderr) == (0, "")
    assert "every rendering of it without a number of its own" in template.stdout
    rows = table(cli("list").stdout)
    for name in ("tenat:7", "tenant:{tenantid}"):
        assert (rows[name]["CODE"], rows[name]["SET"], rows[name]["TASKS"]) == ("-", "3", "-")


@pytest.mark.parametrize(
    ("args", "hint", "says"),
    [
        (("tenant:7", "-1"), "N", "must be a whole number >= 0"),
        (("tenant:7", "abc"), "'N'", "is not a valid integer"),
        (("tenant:7", "2.5"), "'N'", "is not a valid integer"),
        (("", "3"), "NAME", "cannot be empty"),
        (("tenant 7", "3"), "NAME", "cannot hold whitespace"),
        (("x" * (MAX_NAME + 1), "3"), "NAME", f"at most {MAX_NAME} characters"),
    ],
)
def test_a_bad_name_or_number_is_a_usage_error(
    cli: Cli, client: redis.Redis, prefix: str, args: tuple[str, str], hint: str, says: str
) -> None:
    """A negative or non-integer N, and an empty, blank-holding or too long NAME, exit with
    status 2 naming the argument and why; nothing is written."""
    done = cli("set", *args)

    assert done.returncode == 2, done.stdout + done.stderr
    assert f"Invalid value for {hint}" in done.stderr
    assert says in done.stderr
    assert done.stdout == ""
    assert client.exists(capacities(prefix)) == 0


def test_json_output_is_a_list_of_objects(
    cli: Cli, take: Take, client: redis.Redis, prefix: str
) -> None:
    """``list --json`` prints one object per limit: its name, templates, the code's
    numbers, the number set (and its stored text), the numbers that apply, live use, holds
    and tasks; a stored value the scripts skip shows as set null with its text."""
    take(EXPORT, "r1", "acme", heavy=True)
    client.hset(capacities(prefix), mapping={"global:exports": "oops", "tenant:acme": "0x10"})

    done = cli("list", "--json")

    assert done.returncode == 0, done.stderr
    rows = {row["limit"]: row for row in json.loads(done.stdout)}
    assert set(rows) == {"global:exports", "tenant:acme", "tenant:{tenant}"}
    assert rows["tenant:acme"] == {
        "limit": "tenant:acme", "templates": ["tenant:{tenant}"], "code": [2], "set": 16,
        "stored": "0x10", "applies": [16], "in_use": 2, "holds": 1, "tasks": [EXPORT],
        "problems": [],
    }  # fmt: skip
    assert rows["global:exports"]["set"] is None
    assert rows["global:exports"]["stored"] == "oops"
    assert rows["global:exports"]["applies"] == [limitsproj.IN_ALL]  # skipped: the code's
    assert rows["tenant:{tenant}"]["in_use"] is None
    assert table(cli("list").stdout)["global:exports"]["SET"] == "'oops'(ignored)"


def test_a_limit_key_of_another_type_is_named_and_the_others_still_listed(
    cli: Cli, take: Take, client: redis.Redis, prefix: str
) -> None:
    """A string planted at one limit's key (which every take of that limit refuses) does
    not hide the others: ``list`` exits 0, shows every limit with live use where it can be
    read, ``?`` for the planted one's use, and a warning on stderr naming the key and its
    type; ``--json`` gives the same rows, the planted key in the problems of its row."""
    take(EXPORT, "r1", "acme", heavy=True)
    planted = stack_base(prefix) + "limit:tenant:globex"
    client.set(planted, "not a sorted set")

    done = cli("list")

    assert done.returncode == 0, done.stderr
    rows = table(done.stdout)
    assert set(rows) == {"global:exports", "tenant:acme", "tenant:globex", "tenant:{tenant}"}
    assert (rows["tenant:acme"]["IN USE"], rows["tenant:acme"]["HOLDS"]) == ("2", "1")
    assert (rows["global:exports"]["IN USE"], rows["global:exports"]["HOLDS"]) == ("2", "1")
    assert (rows["tenant:globex"]["IN USE"], rows["tenant:globex"]["HOLDS"]) == ("?", "?")
    assert rows["tenant:globex"]["TASKS"] == EXPORT
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1, done.stderr
    assert repr(planted) in warnings[0]
    assert "holds a string value, not a sorted set of shares" in warnings[0]

    done = cli("list", "--json")

    assert done.returncode == 0, done.stderr
    by_name = {row["limit"]: row for row in json.loads(done.stdout)}
    assert by_name["tenant:acme"]["in_use"] == 2
    assert by_name["tenant:acme"]["problems"] == []
    globex = by_name["tenant:globex"]
    assert (globex["in_use"], globex["holds"]) == (None, None)
    assert [problem["key"] for problem in globex["problems"]] == [planted]
    assert globex["problems"][0]["limit"] == "tenant:globex"
    assert "string" in globex["problems"][0]["problem"]
    assert repr(planted) in done.stderr


def test_a_numbers_hash_of_another_type_is_named_and_the_limits_still_listed(
    cli: Cli, take: Take, client: redis.Redis, prefix: str
) -> None:
    """A list planted where the numbers set at run time live: ``list`` exits 0, shows the
    limits with their live use and the code's numbers, ``?`` as SET, and a warning naming
    the hash's key; in ``--json`` every row carries the problem."""
    take(EXPORT, "r1", "acme")
    client.rpush(capacities(prefix), "x")

    done = cli("list")

    assert done.returncode == 0, done.stderr
    rows = table(done.stdout)
    assert rows["tenant:acme"]["IN USE"] == "1"
    assert rows["tenant:acme"]["SET"] == "?"
    assert rows["global:exports"]["CODE"] == str(limitsproj.IN_ALL)
    assert repr(capacities(prefix)) in done.stderr
    assert "holds a list value, not a hash of limit numbers" in done.stderr

    by_name = {row["limit"]: row for row in json.loads(cli("list", "--json").stdout)}
    assert all(
        [problem["key"] for problem in row["problems"]] == [capacities(prefix)]
        for row in by_name.values()
    )


@pytest.fixture
def admin(fresh_server: RedisServer) -> Iterator[redis.Redis]:
    """The default user of a server of this test's own."""
    client = redis.Redis.from_url(fresh_server.url)
    yield client
    client.close()


def test_passwords_are_never_shown(cli: Cli, fresh_server: RedisServer, admin: redis.Redis) -> None:
    """With a password in the lock URL, ``set``, ``unset`` and ``list`` print the URL
    masked, and so does the error of an unreachable lock Redis (exit status 69)."""
    admin.acl_setuser("limiter", enabled=True, passwords=["+s3cret-pw"], keys=["*"],
                      channels=["*"], commands=["+@all"])  # fmt: skip
    url = f"redis://limiter:s3cret-pw@127.0.0.1:{fresh_server.port}/0"
    down = f"redis://limiter:s3cret-pw@127.0.0.1:{free_port()}/0"

    runs = [cli("set", "tenant:7", "3", url=url), cli("list", url=url)]
    runs += [cli("list", "--json", url=url), cli("unset", "tenant:7", url=url)]
    failed = cli("list", url=down)

    for done in runs:
        assert done.returncode == 0, done.stderr
        assert "s3cret-pw" not in done.stdout + done.stderr
    assert all("limiter:**@" in done.stdout for done in (runs[0], runs[1], runs[3]))
    assert failed.returncode == 69
    assert "limiter:**@" in failed.stderr
    assert "s3cret-pw" not in failed.stdout + failed.stderr


# ------------------------------------------------------------------------- the docs


def docs_sample() -> str:
    """The transcript docs/operations.md shows for ``locks limit`` (after its marker)."""
    page = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    found = re.search(r"<!-- LIMIT SAMPLE: .*? -->\n```console\n(.*?)```\n", page, re.DOTALL)
    assert found is not None, "docs/operations.md lost the locks limit sample"
    return found.group(1)


def test_the_docs_sample_is_what_the_command_prints(
    cli: Cli, take: Take, redis_server: RedisServer, prefix: str
) -> None:
    """docs/operations.md's ``locks limit`` transcript is what the real command prints for
    the runs it describes (a heavy export and an audit of tenant acme, an export of tenant
    7), with the URL and the prefix shown as the docs show them."""
    take(EXPORT, "q3-sales", "acme", heavy=True)
    take(EXPORT, "q3-costs", "7")
    take(AUDIT, "acme")
    transcript = ""
    for args in (("set", "tenant:7", "3"), ("list",)):
        done = cli(*args)
        assert done.returncode == 0, done.stderr
        transcript += f"$ celery -A proj locks limit {' '.join(args)}\n{done.stdout}"
    transcript = transcript.replace(redis_server.url, DOCS_URL).replace(prefix, DOCS_PREFIX)

    assert transcript == docs_sample()


# ---------------------------------------------------------------- the pure helpers


def test_stored_numbers_read_as_the_scripts_read_them(client: redis.Redis) -> None:
    """``parse_number`` takes a stored value as Lua's ``tonumber`` and the scripts' whole
    number check do, on the real server's Lua: decimal, exponent, hex and blanks read;
    fractions, negatives, NaN and junk are skipped; ``inf`` is no limit."""
    check = (
        "local n = tonumber(ARGV[1]) "
        "if n and n >= 0 and n == math.floor(n) then return tostring(n) end return false"
    )
    values = ["3", " 5 ", "5\n", "+7", "5.0", "1e2", "0x10", "0X1f", "0", "-0", "007",
              "5.5", "-1", "nan", "abc", "", "1_0", "3x", "inf", "-inf", "infinity"]  # fmt: skip
    for value in values:
        lua = client.eval(check, 0, value)
        ours = parse_number(value)
        if lua is None:
            assert ours is None, value
        elif lua in (b"inf", b"infinity"):
            assert ours == float("inf"), value
        else:
            assert ours == int(float(lua)), value


def test_renderings_match_their_templates() -> None:
    """A name renders a template when its fixed text matches and each field is some
    non-empty text without a colon; a template with fields is its own limit only."""
    assert renders("tenant:{tenant_id}", "tenant:7")
    assert renders("tenant:{tenant_id}", "tenant:#3f2a9c")
    assert not renders("tenant:{tenant_id}", "tenant:")
    assert not renders("tenant:{tenant_id}", "tenant:7:x")
    assert not renders("tenant:{tenant_id}", "tenants:7")
    assert not renders("tenant:{tenant_id}", "tenant:{tenantid}")  # a mistyped template
    assert renders("r.{a}-{b}", "r.x-y")
    assert renders("global:exports", "global:exports")
    assert not renders("global:exports", "global:export")
    templates = ["global:{kind}", "global:exports", "tenant:{t}"]
    assert templates_of("global:exports", templates) == ("global:{kind}", "global:exports")
    assert templates_of("tenant:{t}", templates) == ("tenant:{t}",)
    assert templates_of("tenat:7", templates) == ()
    assert closest("tenat:7", templates) == "tenant:7"
    assert closest("glbal:exports", ["global:exports"]) == "global:exports"
    assert closest("zzz", templates) is None


def test_tasks_that_disagree_show_every_number() -> None:
    """When two tasks give one template different numbers, CODE and APPLIES show both
    (each task's runs meet their own), and a number set by name applies to all."""
    code = [CodeLimit("global:exports", 5, "a"), CodeLimit("global:exports", 8, "b")]

    (row,) = build_rows(code, {}, {"global:exports": Usage(3, 2)})
    (named,) = build_rows(code, {"global:exports": b"4"}, {})

    assert row.cells() == ("global:exports", "5|8", "-", "5|8", "3", "2", "a, b")
    assert named.cells()[1:4] == ("5|8", "4", "4")


def test_locks_explain_names_the_limit_that_holds_a_call_back(
    redis_server: RedisServer, prefix: str, take: Take
) -> None:
    """``celery locks explain`` of a call whose key is free but whose tenant is full (two
    holds of weight 1, number 2): state ``limited``, and its limits with their use."""
    take(EXPORT, "r1", "acme")
    take(EXPORT, "r2", "acme")
    environ = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "CSL_CLI_URL": redis_server.url,
        "CSL_CLI_PREFIX": prefix,
    }
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", APP, "locks", "explain", EXPORT, '"r3"', '"acme"',
         "--json"],
        cwd=ROOT, env=environ, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["state"] == "limited"
    uses = {use["name"]: use for use in found["limits"]}
    assert uses["tenant:acme"]["used"] == 2
    assert uses["tenant:acme"]["number"] == 2
    assert uses["tenant:acme"]["fits"] is False
    assert uses["global:exports"]["fits"] is True
    text = subprocess.run(
        [sys.executable, "-m", "celery", "-A", APP, "locks", "explain", EXPORT, '"r3"', '"acme"'],
        cwd=ROOT, env=environ, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=240, check=False,
    ).stdout  # fmt: skip
    assert "tenant:acme: 2 of 2 used by 2 holds" in text
    assert "does not fit" in text
