"""The least-privilege ACL user of docs/deployment.md works, as written on the page.

The test creates exactly the user the page shows (its ``redis-cli ACL SETUSER`` line, run as
is) on a redis-server of its own, points a real ``celery worker``'s locks at it, and runs
every conflict policy and mode through it (park, in arrival and in call order, stacked
limits and a run whose lease is lost included), then ``celery locks list``, ``check``,
``clear``, ``reap``, ``explain`` and ``limit``, and ``skip_info``: everything must work,
and the server must deny nothing. The page itself is what ``scripts/gen_docs.py``
generates from the code (see ``test_generated.py``). A run the test must find inside its
body is held there until the test opens its gate (``aclproj.record``), never by a sleep.
"""

from __future__ import annotations

import importlib
import os
import re
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import redis
from celery._state import _set_current_app, get_current_app

from celery_singleton_lock import LockLost, TaskLocked, skip_info
from celery_singleton_lock.config import clear_settings
from celery_singleton_lock.testing import CeleryWorker, RedisServer

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "deployment.md"
MODES = {True: "Scripts (the default):", False: "Plain commands"}

pytestmark = pytest.mark.slow


def documented_setuser(scripting: bool) -> list[str]:
    """The arguments of the page's ``redis-cli ACL SETUSER`` command for that mode, as a
    shell would pass them (after ``redis-cli``)."""
    text = PAGE.read_text(encoding="utf-8")
    start = text.index(MODES[scripting])
    block = re.search(r"```sh\n(.*?)```", text[start:], re.S)
    assert block is not None
    words = shlex.split(block.group(1).replace("\\\n", " "))
    assert words[:3] == ["redis-cli", "ACL", "SETUSER"], words
    return words[1:]


def user_url(server: RedisServer, setuser: list[str]) -> str:
    """The lock URL of the documented user (its name and password from the command)."""
    user = setuser[2]
    password = next(word[1:] for word in setuser if word.startswith(">"))
    return f"redis://{user}:{password}@127.0.0.1:{server.port}/0"


def denials(admin: redis.Redis, *expected: str) -> list[Any]:
    """What the server refused (ACL LOG), less redis-py's connect-time CLIENT SETINFO,
    which redis-py ignores when refused, the INFO of `locks check` (the page says that
    without ``+info`` its server and eviction checks cannot read the server) and the
    ``expected`` commands."""
    ignored = ("client|setinfo", "info", *expected)
    return [entry for entry in admin.acl_log(count=100) if entry.get("object") not in ignored]


def wait_for(check: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        if time.monotonic() > deadline:
            raise TimeoutError(check)
        time.sleep(0.05)
    return found


class Rig:
    """The server, the documented user, a worker of ``aclproj`` and the CLI, for one mode."""

    def __init__(self, server: RedisServer, tmp: Path, scripting: bool) -> None:
        self.server = server
        self.admin = redis.Redis.from_url(server.url)
        self.setuser = documented_setuser(scripting)
        self.admin.execute_command(*self.setuser)
        self.admin.execute_command("ACL", "LOG", "RESET")
        self.env = {
            "PYTHONPATH": str(ROOT),
            "CSL_ACL_BROKER_URL": server.url.replace("/0", "/1"),
            "CSL_ACL_LOCK_URL": user_url(server, self.setuser),
            "CSL_ACL_SCRIPTING": "1" if scripting else "0",
            "CSL_ACL_QUEUE": f"acl-{uuid.uuid4().hex[:8]}",
        }
        self.data = redis.Redis.from_url(server.url.replace("/0", "/3"), decode_responses=True)
        self.worker = CeleryWorker(
            "tests.docs.aclproj", concurrency=4, env=self.env, cwd=ROOT,
            log_path=tmp / "worker.log", ready_timeout=120,
        )  # fmt: skip

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "celery", "-A", "tests.docs.aclproj", "locks", *args],
            cwd=ROOT, env={**os.environ, **self.env}, capture_output=True, text=True,
            timeout=120, check=False, stdin=subprocess.DEVNULL,
        )  # fmt: skip

    def started(self, name: str, count: int = 1) -> None:
        wait_for(lambda: self.data.llen(f"runs:{name}") >= count)

    def open(self, name: str) -> None:
        """Let the gated runs of ``name`` end."""
        self.data.set(f"open:{name}", 1)

    def runs(self, name: str) -> list[int]:
        return [int(value) for value in self.data.lrange(f"runs:{name}", 0, -1)]

    def close(self) -> None:
        self.worker.close()
        self.admin.close()
        self.data.close()


@pytest.fixture
def rig(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Rig, ModuleType]]:
    """A rig for ``request.param`` (scripting), and ``aclproj`` imported here with its
    environment (a fresh import: the settings differ per mode)."""
    with RedisServer() as server:
        setup = Rig(server, tmp_path, request.param)
        for name, value in setup.env.items():
            monkeypatch.setenv(name, value)
        sys.modules.pop("tests.docs.aclproj", None)
        proj = importlib.import_module("tests.docs.aclproj")
        previous = get_current_app()
        try:
            setup.worker.start()
            yield setup, proj
        finally:
            _set_current_app(previous)
            clear_settings(proj.app)
            sys.modules.pop("tests.docs.aclproj", None)
            setup.close()


def exercise_the_policies(rig: Rig, proj: ModuleType) -> None:
    """skip (with skip_info), wait, retry, raise, queue scope, lock_release="start", and
    lock_on_lost="raise" (a run whose key an operator deleted ends with LockLost)."""
    first = proj.skip.delay("skip", -1, 1)  # held until the gate opens
    rig.started("skip")
    duplicate = proj.skip.delay("skip", 0, 2)
    assert duplicate.get(timeout=20) is None
    rig.open("skip")
    assert first.get(timeout=20) == 1
    found = skip_info(duplicate, app=proj.app)
    assert found is not None
    assert found.holder_task_id == first.id

    for task, name in ((proj.wait, "wait"), (proj.retry, "retry")):
        results = [task.delay(name, 0.3, value) for value in (1, 2, 3)]
        assert sorted(result.get(timeout=30) for result in results) == [1, 2, 3]
        assert int(rig.data.get(f"peak:{name}") or 0) == 1

    held = proj.raise_.delay("raise", -1, 1)
    rig.started("raise")
    refused = proj.raise_.delay("raise", 0, 2)
    with pytest.raises(TaskLocked):
        refused.get(timeout=20)
    rig.open("raise")
    assert held.get(timeout=20) == 1

    queued = proj.queued.delay("queued", 1.0, 1)
    assert proj.queued.delay("queued", 0, 2).id == queued.id  # published nothing
    assert queued.get(timeout=20) == 1

    early = proj.release_start.delay("start", 1.0, 1)
    rig.started("start")
    later = proj.release_start.delay("start", 0, 2)  # the key was freed as the body started
    assert later.id != early.id
    assert sorted([early.get(timeout=20), later.get(timeout=20)]) == [1, 2]

    renewed = proj.lost.delay("renewed", 2.5, 1)  # a 1 s lease renewed through the user
    assert renewed.get(timeout=30) == 1
    doomed = proj.lost.delay("doomed", 60, 1)
    rig.started("doomed")
    rig.admin.delete(proj.lost.lock_key("doomed", 60, 1))  # the lease is gone
    with pytest.raises(LockLost):
        doomed.get(timeout=60)


def exercise_the_modes(rig: Rig, proj: ModuleType) -> None:
    """coalesce, replace, slots, debounce, throttle, a success hold, park, park in the
    order of the calls (lock_order="enqueue") and a stacked limit."""
    holder = proj.coalesce.delay("coalesce", -1, 1)
    rig.started("coalesce")
    second, third = (proj.coalesce.delay("coalesce", 0, value) for value in (2, 3))
    assert second.id == third.id != holder.id
    rig.open("coalesce")
    assert third.get(timeout=30) == 3
    assert rig.runs("coalesce") == [1, 3]

    # a countdown that leaves the newer call seconds to come first; whether the superseded
    # message ran is checked at the end, once the worker says it dropped it
    superseded = proj.replace.apply_async(("replace", 0, 1), countdown=5)
    newer = proj.replace.delay("replace", 0, 2)
    assert newer.get(timeout=30) == 2
    assert superseded.state == "REVOKED"

    results = [proj.slots.delay("slots", 0.5, value) for value in (1, 2, 3, 4)]
    assert sorted(result.get(timeout=30) for result in results) == [1, 2, 3, 4]
    assert int(rig.data.get("peak:slots") or 0) <= 2

    burst = [proj.debounce.delay("debounce", 0, value) for value in (1, 2, 3)]
    assert len({result.id for result in burst}) == 1  # within the 5 s quiet time
    assert burst[0].get(timeout=60) == 3
    assert rig.runs("debounce") == [3]

    assert proj.throttle.delay("throttle", 0, 1).get(timeout=20) == 1
    throttled = proj.throttle.delay("throttle", 0, 2)
    assert throttled.get(timeout=20) is None
    found = skip_info(throttled, app=proj.app)
    assert found is not None
    assert found.reason == "throttled"

    succeeded = proj.success.delay("success", 0, 1)
    assert succeeded.get(timeout=20) == 1
    again = proj.success.delay("success", 0, 2)
    assert again.get(timeout=20) is None  # the success holds the key
    found = skip_info(again, app=proj.app)
    assert found is not None
    assert found.holder_task_id == succeeded.id

    holder = proj.park.delay("park", -1, 1)
    rig.started("park")
    parked = [proj.park.delay("park", 0, value) for value in (2, 3)]
    assert wait_for(lambda: {result.state for result in parked} == {"PARKED"}, timeout=60)
    rig.open("park")
    assert holder.get(timeout=20) == 1
    assert sorted(result.get(timeout=30) for result in parked) == [2, 3]
    assert int(rig.data.get("peak:park") or 0) == 1

    in_order = [proj.ordered.delay("ordered", 0.3, value) for value in (1, 2, 3, 4)]
    assert [result.get(timeout=30) for result in in_order] == [1, 2, 3, 4]
    assert rig.runs("ordered") == [1, 2, 3, 4]

    shares = [proj.stacked.delay("stacked", -1, value) for value in (1, 2, 3)]
    rig.started("stacked", 2)  # two runs hold the limit's 2, the third is held back
    assert proj.stacked.lock_explain("stacked", -1, 9).state == "limited"
    rig.open("stacked")
    assert sorted(result.get(timeout=30) for result in shares) == [1, 2, 3]
    assert int(rig.data.get("peak:stacked") or 0) == 2  # distinct keys, two at a time

    # the superseded message was delivered (its countdown passed meanwhile) and dropped
    dropped = f"acl.replace[{superseded.id}] not run: superseded"
    assert wait_for(lambda: dropped in rig.worker.log(), timeout=60), "never delivered"
    assert rig.runs("replace") == [2]


def exercise_the_limits_cli(rig: Rig, proj: ModuleType) -> None:
    """``locks limit set``, ``list`` and ``unset`` and ``locks explain`` of a held key."""
    listed = rig.cli("limit", "set", "acl:stacked", "3")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    listed = rig.cli("limit", "list")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert re.search(r"^acl:stacked +2 +3 +3", listed.stdout, re.M), listed.stdout
    unset = rig.cli("limit", "unset", "acl:stacked")
    assert unset.returncode == 0, unset.stdout + unset.stderr
    running = proj.skip.delay("explained", -1, 1)
    rig.started("explained")
    explained = rig.cli("explain", "acl.skip", '"explained"', "0", "1")
    assert explained.returncode == 0, explained.stdout + explained.stderr
    assert running.id in explained.stdout
    rig.open("explained")
    assert running.get(timeout=20) == 1


def exercise_the_cli(rig: Rig, proj: ModuleType) -> None:
    """``locks list`` shows a running holder; ``check``, ``reap`` and ``clear`` succeed."""
    running = proj.skip.delay("listed", -1, 1)
    rig.started("listed")
    listed = rig.cli("list")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert running.id in listed.stdout
    checked = rig.cli("check")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert re.search(r"^  ok +permissions", checked.stdout, re.M), checked.stdout
    assert re.search(r"^  ok +admin", checked.stdout, re.M), checked.stdout
    for check in ("server", "eviction"):  # as the page says, without +info
        assert re.search(rf"^  WARN +{check} +could not check", checked.stdout, re.M)
    # Plain commands: whether scripts could run is asked, and the refusal is the answer.
    assert re.search(r"^  ok +scripting", checked.stdout, re.M), checked.stdout
    reaped = rig.cli("reap", "--dry-run", "--watch", "0.5")
    assert reaped.returncode == 0, reaped.stdout + reaped.stderr
    cleared = rig.cli("clear", "--all", "--yes")
    assert cleared.returncode == 0, cleared.stdout + cleared.stderr
    rig.open("listed")
    assert running.get(timeout=20) == 1


@pytest.mark.parametrize("rig", [True], indirect=True, ids=["scripting"])
def test_the_documented_user_runs_every_mode(rig: tuple[Rig, ModuleType]) -> None:
    setup, proj = rig
    exercise_the_policies(setup, proj)
    exercise_the_modes(setup, proj)
    exercise_the_cli(setup, proj)
    exercise_the_limits_cli(setup, proj)
    assert denials(setup.admin) == [], setup.worker.tail()


@pytest.mark.parametrize("rig", [False], indirect=True, ids=["plain"])
def test_the_documented_plain_user_runs_every_policy(rig: tuple[Rig, ModuleType]) -> None:
    setup, proj = rig
    exercise_the_policies(setup, proj)
    exercise_the_cli(setup, proj)
    # `locks check` tries SCRIPT LOAD to say whether scripts could run: "not available".
    assert denials(setup.admin, "script|load") == [], setup.worker.tail()
