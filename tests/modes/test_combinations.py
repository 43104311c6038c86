"""Invalid combinations of the modes' options and bad rate strings: refused in one place
(``options.check_combinations``) with one line naming the options — at decorator use,
per call, in ``singleton_lock_tasks``, and by a real worker at start (exit 78)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from celery.exceptions import ImproperlyConfigured

from celery_singleton_lock import LockedTask
from celery_singleton_lock.config import clear_settings
from celery_singleton_lock.modes import COMBINATIONS
from celery_singleton_lock.options import parse_rate, task_option_names, validate_task_options
from celery_singleton_lock.runtime import locking_for
from celery_singleton_lock.testing import RedisServer
from tests.modes.badproj import QUEUE
from tests.modes.conftest import ROOT

#: sysexits.h EX_CONFIG: what a worker with a bad configuration exits with.
EX_CONFIG = 78


@pytest.fixture
def make_app() -> Iterator[Any]:
    """Throwaway apps on the in-memory broker (nothing is published: every case raises
    before, or only resolves options)."""
    apps: list[Celery] = []

    def factory(**conf: Any) -> Celery:
        app = Celery(f"combo{len(apps)}", broker="memory://", set_as_current=False)
        app.conf.update(conf)
        apps.append(app)
        return app

    yield factory
    for app in apps:
        clear_settings(app)
        app.close()


@pytest.mark.parametrize(
    ("options", "conf", "named"),
    [
        ({"lock_release": "start"}, {}, ["lock_release='start'", "lock_scope='queue'"]),
        ({"lock_release": "success"}, {}, ["lock_release='success'", "lock_hold"]),
        ({"lock_hold": 5}, {}, ["lock_hold", "lock_release='success'"]),
        ({"lock_scope": "queue", "lock_release": "start", "lock_hold": 5}, {},
         ["lock_hold", "lock_release='success'"]),
        ({"lock_rate_limit": "10/m"}, {"singleton_lock_scripting": False},
         ["lock_rate_limit", "singleton_lock_scripting=False"]),
        ({"lock_release": "success", "lock_hold": 5}, {"singleton_lock_scripting": False},
         ["lock_release='success'", "singleton_lock_scripting=False"]),
        ({"lock_release": "start"}, {"singleton_lock_scope": "run"},
         ["lock_release='start'", "lock_scope='queue'"]),
        ({"lock_limit": 3}, {"singleton_lock_scripting": False},
         ["lock_limit > 1", "singleton_lock_scripting=False"]),
        ({"lock_on_conflict": "coalesce"}, {},
         ["lock_on_conflict='coalesce'", "lock_scope='queue'"]),
        ({"lock_on_conflict": "replace"}, {}, ["'replace'", "lock_scope='queue'"]),
        ({"lock_on_conflict": "coalesce", "lock_scope": "queue", "lock_limit": 2}, {},
         ["'coalesce'", "lock_limit=1"]),
        ({"lock_on_conflict": "replace", "lock_scope": "queue", "lock_release": "start"}, {},
         ["'replace'", "lock_release='end'"]),
        ({"lock_replace_running": True}, {}, ["lock_replace_running", "'replace'"]),
        ({"lock_debounce_max_wait": 5}, {}, ["lock_debounce_max_wait", "lock_debounce"]),
        ({"lock_debounce": 2, "lock_debounce_max_wait": 1}, {},
         ["lock_debounce_max_wait", "at least lock_debounce"]),
        ({"lock_debounce": 2, "lock_scope": "queue", "lock_on_conflict": "coalesce"}, {},
         ["lock_debounce", "'coalesce'"]),
    ],
    ids=["start-in-run", "success-without-hold", "hold-without-success",
         "hold-with-start", "rate-without-scripts", "success-without-scripts",
         "start-with-run-setting", "slots-without-scripts", "coalesce-in-run",
         "replace-in-run", "coalesce-with-slots", "replace-with-start",
         "replace-running-without-replace", "max-wait-without-debounce",
         "max-wait-below-debounce", "debounce-with-coalesce"],
)  # fmt: skip
def test_invalid_combination_fails_the_first_call(
    make_app: Any, options: dict[str, Any], conf: dict[str, Any], named: list[str]
) -> None:
    """A task whose options do not go together fails its first delay() with one line that
    names the task and every option involved, before anything is published."""
    app = make_app(**conf)

    @app.task(name="combo.task", base=LockedTask, shared=False, **options)
    def task() -> None:
        """Never runs."""

    with pytest.raises(ImproperlyConfigured) as caught:
        task.delay()
    message = str(caught.value)
    assert message.startswith("task 'combo.task': ")
    assert "\n" not in message
    for name in named:
        assert name in message


def test_every_broken_rule_is_named_at_once(make_app: Any) -> None:
    """Options that break two rules get one message naming both."""
    app = make_app(singleton_lock_scripting=False)

    @app.task(name="combo.two", base=LockedTask, shared=False, lock_release="start",
              lock_rate_limit="1/s")  # fmt: skip
    def two() -> None:
        """Never runs."""

    with pytest.raises(ImproperlyConfigured) as caught:
        locking_for(app.tasks["combo.two"])
    assert "lock_scope='queue'" in str(caught.value)
    assert "singleton_lock_scripting=False" in str(caught.value)


@pytest.mark.parametrize(
    "options",
    [
        {"lock_scope": "queue", "lock_release": "start"},
        {"lock_release": "success", "lock_hold": 0.5},
        {"lock_scope": "queue", "lock_release": "success", "lock_hold": 3600},
        {"lock_rate_limit": "10/m"},
        {"lock_scope": "queue", "lock_rate_limit": 5, "lock_release": "start"},
    ],
    ids=["start-in-queue", "success-in-run", "success-in-queue", "rate-in-run",
         "rate-and-start-in-queue"],
)  # fmt: skip
def test_valid_combinations_resolve(make_app: Any, options: dict[str, Any]) -> None:
    """The combinations the modes allow resolve to the options as given."""
    app = make_app()

    @app.task(name="combo.ok", base=LockedTask, shared=False, **options)
    def ok() -> None:
        """Never runs."""

    locking = locking_for(app.tasks["combo.ok"])
    assert locking is not None
    for name, value in options.items():
        got = getattr(locking.options, name.removeprefix("lock_"))
        assert got == (f"{value}/s" if name == "lock_rate_limit" and value == 5 else value)


def test_per_call_options_are_checked_together_with_the_task_s(make_app: Any) -> None:
    """A per-call option that breaks a rule together with the task's own options fails that
    apply_async, naming the per-call origin; the task itself stays usable."""
    app = make_app()

    @app.task(name="combo.queued", base=LockedTask, shared=False, lock_scope="queue",
              lock_release="start")  # fmt: skip
    def queued() -> None:
        """Never runs."""

    @app.task(name="combo.run", base=LockedTask, shared=False)
    def run() -> None:
        """Never runs."""

    with pytest.raises(ImproperlyConfigured, match=r"lock_scope='queue'") as caught:
        queued.apply_async(lock_scope="run")
    assert "per-call" in str(caught.value)
    with pytest.raises(ImproperlyConfigured, match=r"lock_hold"):
        run.apply_async(lock_hold=2)
    assert locking_for(app.tasks["combo.queued"]) is not None


def test_singleton_lock_tasks_entries_are_checked_per_task(make_app: Any) -> None:
    """A singleton_lock_tasks entry whose options do not go together (with the settings)
    fails the first use of each task it matches, naming that task."""
    app = make_app(singleton_lock_tasks={"billing.*": {"lock_hold": 10}})

    @app.task(name="billing.invoice", shared=False)
    def invoice() -> None:
        """Never runs."""

    with pytest.raises(ImproperlyConfigured, match=r"task 'billing.invoice': lock_hold"):
        locking_for(app.tasks["billing.invoice"])


@pytest.mark.parametrize(
    ("given", "canonical", "parsed"),
    [("10/m", "10/m", (10, 60_000)), ("1/s", "1/s", (1, 1000)), ("3/h", "3/h", (3, 3_600_000)),
     ("5", "5/s", (5, 1000)), (7, "7/s", (7, 1000)), ("0010/s", "10/s", (10, 1000))],
)  # fmt: skip
def test_rate_strings_are_read_as_celery_writes_them(
    given: object, canonical: str, parsed: tuple[int, int]
) -> None:
    """Celery's rate strings "N/s", "N/m", "N/h" and a bare N (per second) are accepted,
    normalised to "N/unit", and read as (N, window ms)."""
    options = validate_task_options({"lock_rate_limit": given}, "task 't'")
    assert options["lock_rate_limit"] == canonical
    assert parse_rate(canonical) == parsed


@pytest.mark.parametrize(
    "given",
    ["10/y", "10/minute", "10 /m", " 10/m", "10/m ", "0/s", "1.5/s", "-1/s", "", "/s", "10/",
     "10/M", "100001/s", 0, -3, 1.5, True, ["10/m"], "1e3/s"],
)  # fmt: skip
def test_bad_rate_strings_are_refused_naming_the_option(given: object) -> None:
    """Anything but a whole number of starts (1 to 100000) per s, m or h is refused with a
    message naming lock_rate_limit and the accepted forms."""
    with pytest.raises(ImproperlyConfigured) as caught:
        validate_task_options({"lock_rate_limit": given}, "task 't'")
    assert str(caught.value).startswith("task 't': lock_rate_limit must be a rate 'N/s'")


def test_every_rule_names_the_options_it_is_about() -> None:
    """Each rule of the one combination table names at least two settings or options (as
    whole words: ``lock_limit`` is not named by ``lock_limits``), so its line tells the
    user what to change."""
    options = {*task_option_names(), "singleton_lock_scripting"}
    for rule in COMBINATIONS:
        named = set(re.findall(r"\b(?:singleton_)?lock_[a-z_]+", rule.message)) & options
        assert len(named) >= 2, rule.message


# -- a real worker refuses to start -----------------------------------------------------


@pytest.fixture(scope="module")
def bad_redis() -> Iterator[RedisServer]:
    """The broker and lock Redis of the refused workers."""
    with RedisServer() as server:
        yield server


@pytest.mark.slow
@pytest.mark.parametrize(
    ("bad", "named"),
    [
        ("start-in-run", ["task 'badproj.sync'", "lock_release='start'", "lock_scope='queue'"]),
        ("bad-rate", ["singleton_lock_tasks", "lock_rate_limit", "'10/y'"]),
        ("hold-without-success", ["task 'badproj.held'", "lock_hold", "lock_release='success'"]),
    ],
)  # fmt: skip
def test_worker_refuses_to_start_on_an_invalid_combination(
    bad_redis: RedisServer, bad: str, named: list[str]
) -> None:
    """A worker whose tasks have options that do not go together (or a bad rate string)
    exits 78 with one line naming them, and consumes no message."""
    client = redis.Redis.from_url(bad_redis.url)
    env = {**os.environ, "CSL_MODES_URL": bad_redis.url, "CSL_MODES_BAD": bad,
           "PYTHONPATH": str(ROOT)}  # fmt: skip
    subprocess.run(
        [sys.executable, "-c", "from tests.modes.badproj import plain; plain.delay()"],
        cwd=ROOT, env=env, check=True, timeout=60,
    )  # fmt: skip
    assert client.llen(QUEUE) == 1
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.modes.badproj", "worker", "--pool",
         "prefork", "--concurrency", "2", "--without-gossip", "--without-mingle",
         "--without-heartbeat"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    printed = done.stdout + done.stderr
    assert done.returncode == EX_CONFIG, printed
    lines = [line for line in printed.splitlines() if all(name in line for name in named)]
    assert len(lines) == 1, printed
    assert "Traceback" not in printed
    assert client.llen(QUEUE) == 1, "the worker consumed a message before refusing to start"
    client.delete(QUEUE)
    client.close()
