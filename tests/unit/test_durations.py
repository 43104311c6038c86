"""Every duration has an upper bound (``MAX_DURATION``, 365 days): each duration option and
setting refuses more with ``ImproperlyConfigured`` naming it (so a worker refuses to start),
the configuration reference shows the bound, and the engine refuses a lease or a wait past it
with ``ValueError``, because a lock value's expiry (server ms + lease) must stay below 2**53.
"""

from __future__ import annotations

import datetime as dt
import math
import types
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from celery.exceptions import ImproperlyConfigured

from celery_singleton_lock import LockedTask, RedisLock
from celery_singleton_lock.config import clear_settings, read_settings
from celery_singleton_lock.engine import constants
from celery_singleton_lock.engine.value import MAX_EXACT, parse_value
from celery_singleton_lock.integration import EX_CONFIG, Preflight, WorkerConfigError, preflight
from celery_singleton_lock.options import (
    MAX_DURATION,
    RATE_UNITS,
    parse_rate,
    reference_markdown,
    setting_names,
    validate_task_options,
)

#: Every option in seconds, and whether it is also an app setting.
DURATIONS = {
    "timeout": True,
    "queue_timeout": True,
    "wait": True,
    "retry_delay": True,
    "debounce": True,
    "debounce_max_wait": True,
    "hold": False,
}
TOO_LONG = (MAX_DURATION + 1, MAX_DURATION + 0.5, 1e14, 10**15, 2**63, 10**400)


def test_the_bound_is_365_days_the_engines_and_inside_the_value_grammar() -> None:
    """One bound for every duration, 365 days, defined by the engine and used by the options;
    even in the year 9999, server ms plus the longest lease and its grace stays below 2**53,
    the largest number a lock value (and a Lua number) holds exactly; and lock_rate_limit,
    whose window is one of N/s, N/m, N/h, is inside it already."""
    assert MAX_DURATION == constants.MAX_DURATION == 31_536_000
    assert dt.timedelta(seconds=MAX_DURATION) == dt.timedelta(days=365)
    year_9999_ms = int(dt.datetime(9999, 12, 31, tzinfo=dt.timezone.utc).timestamp() * 1000)
    lease_ms = MAX_DURATION * 1000
    grace_ms = constants.GRACE_BASE_MS + lease_ms // constants.GRACE_FRACTION
    assert year_9999_ms + lease_ms + grace_ms < MAX_EXACT
    assert max(RATE_UNITS.values()) <= MAX_DURATION
    assert parse_rate("1/h") == (1, 3_600_000)


@pytest.mark.parametrize("field", [name for name, setting in DURATIONS.items() if setting])
def test_every_duration_setting_accepts_the_bound_and_refuses_more(field: str) -> None:
    """singleton_lock_<duration> = MAX_DURATION is read as is; anything longer (1e14 s,
    an int too big for a float) is ImproperlyConfigured naming the setting and the bound."""
    name = f"singleton_lock_{field}"
    assert name in setting_names()
    assert getattr(read_settings({name: MAX_DURATION}), field) == MAX_DURATION
    for value in TOO_LONG:
        with pytest.raises(ImproperlyConfigured, match=rf"^{name} .*<= 31536000 \(365 days\)"):
            read_settings({name: value})


@pytest.mark.parametrize("field", list(DURATIONS))
def test_every_duration_option_accepts_the_bound_and_refuses_more(field: str) -> None:
    """lock_<duration> on a task, a call or a singleton_lock_tasks entry: the same bound."""
    option = f"lock_{field}"
    assert validate_task_options({option: MAX_DURATION}, "task 't'") == {option: MAX_DURATION}
    for value in TOO_LONG:
        with pytest.raises(ImproperlyConfigured, match=rf"^task 't': {option} .*<= 31536000"):
            validate_task_options({option: value}, "task 't'")
        with pytest.raises(ImproperlyConfigured, match=rf"singleton_lock_tasks.*{option}"):
            read_settings({"singleton_lock_tasks": {"a.*": {option: value}}})


def test_waiting_forever_is_none_or_infinity_not_a_huge_number() -> None:
    """lock_wait: None and math.inf still mean "wait forever" (no bound applies to them),
    but a finite wait past the bound is an error, not a disguised "forever"."""
    assert read_settings({"singleton_lock_wait": math.inf}).wait is None
    assert read_settings({"singleton_lock_wait": None}).wait is None
    assert validate_task_options({"lock_wait": math.inf}, "t") == {"lock_wait": None}
    assert validate_task_options({"lock_wait": None}, "t") == {"lock_wait": None}
    with pytest.raises(ImproperlyConfigured, match=r"None or math\.inf: forever"):
        validate_task_options({"lock_wait": 1e300}, "t")


def test_the_reference_table_shows_the_bound_on_every_duration_row() -> None:
    """docs/configuration.md (generated) names the bound in the values of each duration."""
    rows = {
        line.split("|")[1].strip(): line
        for line in reference_markdown().splitlines()
        if line.startswith("| `lock_")
    }
    for field in DURATIONS:
        assert "<= 31536000 (365 days)" in rows[f"`lock_{field}`"], field


@pytest.fixture
def app() -> Iterator[Celery]:
    """A throwaway app (no broker is contacted)."""
    made = Celery("durations", broker="memory://", set_as_current=False)
    yield made
    clear_settings(made)
    made.close()


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"lock_release": "success", "lock_hold": 1e14}, "lock_hold"),
        ({"lock_timeout": 1e14}, "lock_timeout"),
        ({"lock_scope": "queue", "lock_queue_timeout": 1e15}, "lock_queue_timeout"),
        ({"lock_on_conflict": "wait", "lock_wait": 1e14}, "lock_wait"),
        ({"lock_debounce": 1e14}, "lock_debounce"),
    ],
)
def test_a_worker_refuses_to_start_on_a_task_with_an_absurd_duration(
    app: Celery, options: dict[str, Any], named: str
) -> None:
    """The worker's start-up step (the same Preflight ``celery worker`` runs before it
    consumes) refuses a task whose duration option is past the bound: exit 78, naming it."""

    @app.task(base=LockedTask, shared=False, name="durations.job", **options)
    def job(x: int) -> int:
        return x

    with pytest.raises(ImproperlyConfigured, match=named):
        preflight(app)
    with pytest.raises(WorkerConfigError, match=named) as refused:
        Preflight(types.SimpleNamespace(app=app, pool_cls=None))
    assert refused.value.exit_code == EX_CONFIG


def test_a_worker_refuses_to_start_on_an_absurd_setting(app: Celery) -> None:
    """singleton_lock_queue_timeout past the bound stops the worker at start, naming it."""
    app.conf.singleton_lock_queue_timeout = 1e14
    with pytest.raises(WorkerConfigError, match="singleton_lock_queue_timeout") as refused:
        Preflight(types.SimpleNamespace(app=app, pool_cls=None))
    assert refused.value.exit_code == EX_CONFIG


# ---------------------------------------------------------------------------- engine


@pytest.mark.parametrize("keyword", ["timeout", "fallback_poll", "replicas_timeout"])
def test_the_engine_refuses_a_lease_past_the_bound_at_construction(keyword: str) -> None:
    """RedisLock(timeout=...) (and its other durations) past the bound: ValueError, before
    any call to Redis."""
    client = redis.Redis(port=1)  # never connected
    RedisLock(client, "durations:x", **{keyword: MAX_DURATION})
    for value in TOO_LONG:
        with pytest.raises(ValueError, match=rf"{keyword} .*at most 31536000"):
            RedisLock(client, "durations:x", **{keyword: value})


def test_the_engine_refuses_a_wait_or_an_extension_past_the_bound() -> None:
    """acquire(timeout=...) past the bound and extend(timeout=...) past it: ValueError
    before any call to Redis (math.inf and None still wait forever)."""
    lock = RedisLock(redis.Redis(port=1), "durations:x")
    for value in TOO_LONG:
        with pytest.raises(ValueError, match=r"acquire timeout .*at most 31536000"):
            lock.acquire(timeout=value)
        with pytest.raises(ValueError, match=r"timeout .*at most 31536000"):
            lock.extend(timeout=value)


def test_a_lease_of_the_bound_is_held_with_an_expiry(client: redis.Redis, key: str) -> None:
    """On a real server, the longest lease writes a value whose expiry the grammar reads
    (held, by us) and a key that has a TTL; a longer one never reaches the server."""
    with pytest.raises(ValueError, match="timeout"):
        RedisLock(client, key, timeout=1e14)
    assert client.exists(key) == 0
    lock = RedisLock(client, key, timeout=MAX_DURATION)
    assert lock.acquire(blocking=False)
    try:
        value = parse_value(client.get(key) or b"")
        assert value.expiry_ms is not None
        assert value.token == lock.token
        assert lock.owned()
        assert MAX_DURATION * 1000 < client.pttl(key) <= MAX_DURATION * 1000 * 1.2
        lock.extend(MAX_DURATION)
        assert lock.owned()
    finally:
        lock.release()
