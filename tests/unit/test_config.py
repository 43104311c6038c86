"""Unit tests for ``celery_singleton_lock.config`` (real Celery app objects, no broker)."""

from __future__ import annotations

import dataclasses
import gc
import math
import threading
import types
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import ImproperlyConfigured

from celery_singleton_lock import config
from celery_singleton_lock.client import mask_url
from celery_singleton_lock.config import DEFAULT_URL, clear_settings, read_settings, settings_for
from celery_singleton_lock.options import LockOptions, Settings, validate_task_options

DEFAULT_TIMEOUT = LockOptions().timeout
DEFAULT_WAIT = LockOptions().wait


@pytest.fixture
def make_app() -> Iterator[Any]:
    """A factory of throwaway Celery apps, each closed (and its settings forgotten) after."""
    apps: list[Celery] = []

    def factory(**conf: Any) -> Celery:
        app = Celery(f"test{len(apps)}", set_as_current=False)
        app.conf.update(conf)
        apps.append(app)
        return app

    yield factory
    for app in apps:
        clear_settings(app)
        app.close()


@pytest.fixture(autouse=True)
def _no_env_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the developer's CELERY_BROKER_URL / CELERY_RESULT_BACKEND out of these tests."""
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    monkeypatch.delenv("CELERY_RESULT_BACKEND", raising=False)


# -------------------------------------------------------------------- reading


def test_every_setting_is_read(make_app: Any) -> None:
    """Each singleton_lock_* setting on app.conf reaches the settings object."""
    app = make_app(
        singleton_lock_url="rediss://locks:6380/2",
        singleton_lock_prefix="shop",
        singleton_lock_timeout=12,
        singleton_lock_on_conflict="wait",
        singleton_lock_scope="queue",
        singleton_lock_renew=False,
        singleton_lock_wait=None,
        singleton_lock_retry_delay=1.5,
        singleton_lock_tasks={"billing.*": {"lock_keys": ["invoice_id"]}},
        singleton_lock_fail_open=True,
        singleton_lock_scripting=False,
    )
    settings = settings_for(app)
    assert settings.url == "rediss://locks:6380/2"
    assert settings.prefix == "shop"
    assert settings.timeout == 12.0
    assert isinstance(settings.timeout, float)
    assert (settings.on_conflict, settings.scope, settings.renew) == ("wait", "queue", False)
    assert (settings.wait, settings.retry_delay) == (None, 1.5)
    assert settings.tasks == (("billing.*", {"lock_keys": ("invoice_id",)}),)
    assert (settings.fail_open, settings.scripting) == (True, False)


def test_settings_are_frozen() -> None:
    """Neither the settings nor their per-glob options can be changed after validation."""
    settings = read_settings({"singleton_lock_tasks": {"a.*": {"lock_timeout": 1}}})
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.timeout = 1.0  # type: ignore[misc]
    options = settings.tasks[0][1]
    with pytest.raises(TypeError):
        options["lock_timeout"] = 2  # type: ignore[index]


def test_infinite_wait_means_no_limit() -> None:
    """singleton_lock_wait=math.inf is read as None (wait forever)."""
    assert read_settings({"singleton_lock_wait": math.inf}).wait is None
    assert read_settings({"singleton_lock_wait": 0}).wait == 0.0


# ----------------------------------------------------------------- bad values


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("singleton_lock_url", "amqp://guest@localhost//"),
        ("singleton_lock_url", 6379),
        ("singleton_lock_prefix", ""),
        ("singleton_lock_prefix", "a{b}"),
        ("singleton_lock_prefix", "has space"),
        ("singleton_lock_prefix", 5),
        ("singleton_lock_timeout", 0),
        ("singleton_lock_timeout", 0.001),
        ("singleton_lock_timeout", 0.49),
        ("singleton_lock_queue_timeout", 0.001),
        ("singleton_lock_timeout", -1),
        ("singleton_lock_timeout", True),
        ("singleton_lock_timeout", "30"),
        ("singleton_lock_timeout", math.inf),
        ("singleton_lock_timeout", math.nan),
        ("singleton_lock_timeout", None),
        ("singleton_lock_on_conflict", "ignore"),
        ("singleton_lock_on_conflict", None),
        ("singleton_lock_scope", "forever"),
        ("singleton_lock_renew", "false"),
        ("singleton_lock_renew", 1),
        ("singleton_lock_wait", -0.5),
        ("singleton_lock_wait", "60"),
        ("singleton_lock_retry_delay", -1),
        ("singleton_lock_retry_delay", math.inf),
        ("singleton_lock_tasks", ["billing.*"]),
        ("singleton_lock_tasks", {"": {}}),
        ("singleton_lock_tasks", {"billing.*": ["lock_keys"]}),
        ("singleton_lock_fail_open", "yes"),
        ("singleton_lock_scripting", 0),
        ("singleton_lock_limit", 0),
        ("singleton_lock_limit", -2),
        ("singleton_lock_limit", 2.0),
        ("singleton_lock_limit", "3"),
        ("singleton_lock_limit", True),
        ("singleton_lock_replicas", -1),
        ("singleton_lock_replicas", 1.0),
        ("singleton_lock_replicas", True),
        ("singleton_lock_replicas", "1"),
    ],
)
def test_bad_values_name_the_setting(setting: str, value: Any) -> None:
    """Every bad setting raises ImproperlyConfigured whose message starts with its name."""
    with pytest.raises(ImproperlyConfigured) as info:
        read_settings({setting: value})
    assert str(info.value).startswith(setting)


def test_unknown_task_option_is_named() -> None:
    """A typo in a singleton_lock_tasks entry names the entry and the unknown option."""
    with pytest.raises(ImproperlyConfigured) as info:
        read_settings({"singleton_lock_tasks": {"billing.*": {"lock_timout": 5}}})
    message = str(info.value)
    assert message.startswith("singleton_lock_tasks['billing.*']: unknown option 'lock_timout'")
    assert "lock_timeout" in message


def test_bad_task_option_value_is_named() -> None:
    """A bad value inside a singleton_lock_tasks entry names the entry and the option."""
    with pytest.raises(ImproperlyConfigured, match=r"^singleton_lock_tasks\['a\.\*'\]: lock_scope"):
        read_settings({"singleton_lock_tasks": {"a.*": {"lock_scope": "global"}}})


@pytest.mark.parametrize(
    "url",
    [
        "http://user:hunter2@host/",
        "redis://:hunter2@127.0.0.1:99999/0",
        "redis://:hunter2@127.0.0.1:notaport/0",
        "redis://user:hunter2@[::1/0",
        "sentinel://:hunter2@s1:26379;http://:hunter2@s2:26379",
        "redis://:hun/ter2@host:0/0",
        "redis://u:hunter2@host:70000/0?password=hunter2",
    ],
)
def test_bad_urls_are_configuration_errors_without_the_password(url: str) -> None:
    """A rejected URL (scheme, host, port; multi-host and Sentinel included) is an
    ImproperlyConfigured naming the setting, and quotes the URL without its password."""
    with pytest.raises(ImproperlyConfigured, match=r"^singleton_lock_url") as info:
        read_settings({"singleton_lock_url": url})
    assert "hunter2" not in str(info.value)
    assert "hun/ter2" not in str(info.value)


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("redis://:pw@h:1/0", "redis://:**@h:1/0"),
        ("redis://user:p@ss@h/0", "redis://user:**@h/0"),
        ("redis://h:1/0", "redis://h:1/0"),
        ("redis://user@h/0", "redis://user@h/0"),
        ("sentinel://:a@s1:26379;sentinel://:b@s2:26379", "sentinel://:**@s1:26379;sentinel://:**@s2:26379"),
        ("redis://h/0?db=1&password=zz", "redis://h/0?db=1&password=**"),
    ],
)  # fmt: skip
def test_mask_url(url: str, masked: str) -> None:
    assert mask_url(url) == masked


# ------------------------------------------------------------------ url default


@pytest.mark.parametrize(
    ("conf", "expected"),
    [
        ({"broker_url": "redis://broker:6379/1"}, "redis://broker:6379/1"),
        ({"broker_url": "rediss://:pw@broker:6380/0"}, "rediss://:pw@broker:6380/0"),
        ({"broker_url": "unix:///tmp/redis.sock"}, "unix:///tmp/redis.sock"),
        ({"broker_url": "sentinel://s1:26379;sentinel://s2:26379"}, "sentinel://s1:26379"),
        ({"broker_url": "redis://a:1/0;redis://b:1/0"}, "redis://a:1/0"),
        ({"broker_url": ["redis://a:1/0", "redis://b:1/0"]}, "redis://a:1/0"),
        (
            {"broker_url": "amqp://guest@rabbit//", "result_backend": "redis://rb:6379/3"},
            "redis://rb:6379/3",
        ),
        ({"broker_url": "amqp://guest@rabbit//", "result_backend": "rpc://"}, DEFAULT_URL),
        ({}, DEFAULT_URL),
        ({"broker_url": "redis://b/0", "singleton_lock_url": "redis://mine/5"}, "redis://mine/5"),
        ({"broker_url": "redis://b/0", "singleton_lock_url": None}, "redis://b/0"),
    ],
)
def test_url_default(make_app: Any, conf: dict[str, Any], expected: str) -> None:
    """The lock URL is explicit, else a Redis broker, else a Redis result backend, else local."""
    assert settings_for(make_app(**conf)).url == expected
    assert read_settings(conf).url == expected


def test_url_follows_the_broker_environment_variable(
    make_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CELERY_BROKER_URL in the environment wins, as it does for Celery's own broker."""
    monkeypatch.setenv("CELERY_BROKER_URL", "redis://from-env:6379/4")
    app = make_app(broker_url="amqp://guest@rabbit//")
    assert settings_for(app).url == "redis://from-env:6379/4"


# ------------------------------------------------------------- Django namespace


class DjangoSettings:
    """Stands in for django.conf:settings (upper-case attributes, CELERY_ namespace)."""

    CELERY_BROKER_URL = "amqp://guest@rabbit//"
    CELERY_RESULT_BACKEND = "redis://results:6379/2"
    CELERY_SINGLETON_LOCK_PREFIX = "django"
    CELERY_SINGLETON_LOCK_TIMEOUT = 7
    CELERY_SINGLETON_LOCK_TASKS = {"reports.*": {"lock_keys": ()}}  # noqa: RUF012
    DEBUG = True


def test_django_namespace_settings_are_found() -> None:
    """CELERY_SINGLETON_LOCK_* settings loaded with namespace="CELERY" are read."""
    app = Celery("django_style", set_as_current=False)
    try:
        app.config_from_object(DjangoSettings, namespace="CELERY")
        settings = settings_for(app)
        assert settings.prefix == "django"
        assert settings.timeout == 7.0
        assert settings.url == "redis://results:6379/2"
        assert settings.tasks == (("reports.*", {"lock_keys": ()}),)
    finally:
        clear_settings(app)
        app.close()


def test_django_namespace_errors_use_the_written_name() -> None:
    """A bad CELERY_SINGLETON_LOCK_* value is reported under that upper-case name."""
    module = types.ModuleType("fake_django_settings")
    module.CELERY_SINGLETON_LOCK_SCOPE = "everywhere"  # type: ignore[attr-defined]
    app = Celery("django_bad", set_as_current=False)
    try:
        app.config_from_object(module, namespace="CELERY")
        with pytest.raises(ImproperlyConfigured, match=r"^CELERY_SINGLETON_LOCK_SCOPE must be"):
            settings_for(app)
    finally:
        app.close()


@pytest.mark.parametrize(
    "name", ["singleton_lock_timeout", "SINGLETON_LOCK_TIMEOUT", "CELERY_SINGLETON_LOCK_TIMEOUT"]
)
def test_plain_mappings_accept_every_spelling(name: str) -> None:
    """A plain mapping may spell a setting lowercase, uppercase or CELERY_-prefixed."""
    assert read_settings({name: 3}).timeout == 3.0
    with pytest.raises(ImproperlyConfigured, match=f"^{name} must be"):
        read_settings({name: -3})


# ------------------------------------------------------------------ options_for


def test_options_for_plain_task_without_match_is_none() -> None:
    """A task that is not a LockedTask and matches no glob is not locked."""
    settings = read_settings({"singleton_lock_tasks": {"billing.*": {}}})
    assert settings.options_for("shop.buy", None) is None


def test_options_for_locked_task_uses_defaults() -> None:
    """A LockedTask without overrides gets the settings' defaults."""
    settings = read_settings({"singleton_lock_timeout": 9, "singleton_lock_renew": False})
    assert settings.options_for("shop.buy", {}) == LockOptions(
        keys=None,
        timeout=9.0,
        renew=False,
        on_conflict="skip",
        scope="run",
        wait=DEFAULT_WAIT,
        retry_delay=None,
    )


def test_options_for_precedence() -> None:
    """Task overrides beat the first matching glob, which beats the settings defaults."""
    settings = read_settings(
        {
            "singleton_lock_on_conflict": "raise",
            "singleton_lock_tasks": {
                "billing.invoice": {"lock_timeout": 5, "lock_keys": ["invoice_id"]},
                "billing.*": {"lock_timeout": 99, "lock_scope": "queue"},
            },
        }
    )
    from_glob = settings.options_for("billing.invoice", None)
    assert from_glob is not None
    assert (from_glob.timeout, from_glob.keys, from_glob.scope) == (5.0, ("invoice_id",), "run")
    assert from_glob.on_conflict == "raise"
    second = settings.options_for("billing.refund", None)
    assert second is not None
    assert (second.timeout, second.scope, second.keys) == (99.0, "queue", None)
    overridden = settings.options_for("billing.invoice", {"lock_timeout": 1, "lock_keys": ()})
    assert overridden is not None
    assert (overridden.timeout, overridden.keys) == (1.0, ())


def test_options_for_globs_are_case_sensitive() -> None:
    """Globs match with fnmatchcase, so case matters on every platform."""
    settings = read_settings({"singleton_lock_tasks": {"Billing.*": {}}})
    assert settings.options_for("billing.x", None) is None
    assert settings.options_for("Billing.x", None) is not None


def test_options_for_ignores_none_overrides_except_lock_keys() -> None:
    """A None task attribute means "not set", except lock_keys=None meaning every argument."""
    settings = read_settings(
        {"singleton_lock_tasks": {"a.*": {"lock_keys": ["x"], "lock_wait": 5}}}
    )
    options = settings.options_for(
        "a.task",
        {"lock_timeout": None, "lock_wait": None, "lock_scope": None, "lock_keys": None},
    )
    assert options is not None
    assert (options.timeout, options.wait, options.scope) == (DEFAULT_TIMEOUT, 5.0, "run")
    assert options.keys is None


def test_explicit_none_in_a_glob_entry_waits_forever() -> None:
    """lock_wait=None written in singleton_lock_tasks means wait without limit."""
    settings = read_settings({"singleton_lock_tasks": {"a.*": {"lock_wait": None}}})
    options = settings.options_for("a.b", None)
    assert options is not None
    assert options.wait is None


def test_options_for_validates_overrides() -> None:
    """A bad task attribute raises ImproperlyConfigured naming the task and the option."""
    settings = read_settings({})
    with pytest.raises(ImproperlyConfigured, match=r"^task 'shop\.buy': lock_on_conflict"):
        settings.options_for("shop.buy", {"lock_on_conflict": "panic"})
    with pytest.raises(ImproperlyConfigured, match="unknown option 'lock_scop'"):
        settings.options_for("shop.buy", {"lock_scop": "queue"})


def test_options_for_callable_keys_pass_through() -> None:
    """A callable lock_keys is kept as is."""

    def chooser(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        return "x"

    options = read_settings({}).options_for("t", {"lock_keys": chooser})
    assert options is not None
    assert options.keys is chooser


# ------------------------------------------------------------ validate options


def test_validate_task_options_normalises() -> None:
    """Names become tuples, numbers become floats, infinite waits become None."""
    assert validate_task_options(
        {
            "lock_keys": ["a", "b"],
            "lock_timeout": 3,
            "lock_renew": False,
            "lock_on_conflict": "retry",
            "lock_scope": "queue",
            "lock_wait": math.inf,
            "lock_retry_delay": 0,
        },
        "task 't'",
    ) == {
        "lock_keys": ("a", "b"),
        "lock_timeout": 3.0,
        "lock_renew": False,
        "lock_on_conflict": "retry",
        "lock_scope": "queue",
        "lock_wait": None,
        "lock_retry_delay": 0.0,
    }


def test_validate_task_options_drops_unset_values() -> None:
    """None for timeout, renew, policy or scope means "not set" and is dropped."""
    assert validate_task_options(
        {"lock_timeout": None, "lock_renew": None, "lock_scope": None, "lock_retry_delay": None},
        "task 't'",
    ) == {"lock_retry_delay": None}


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"lock_keys": "sku"}, "lock_keys"),
        ({"lock_keys": ["sku", 1]}, "lock_keys"),
        ({"lock_timeout": False}, "lock_timeout"),
        ({"lock_renew": "yes"}, "lock_renew"),
        ({"lock_wait": -1}, "lock_wait"),
        ({"lock_retry_delay": "soon"}, "lock_retry_delay"),
        ({"timeout": 5}, "unknown option 'timeout'"),
    ],
)
def test_validate_task_options_rejects(options: dict[str, Any], fragment: str) -> None:
    """Bad per-task options raise ImproperlyConfigured naming where and which option."""
    with pytest.raises(ImproperlyConfigured) as info:
        validate_task_options(options, "task 'shop.buy'")
    assert str(info.value).startswith("task 'shop.buy': ")
    assert fragment in str(info.value)


def test_validate_task_options_requires_a_mapping() -> None:
    """Options given as something other than a mapping are refused."""
    with pytest.raises(ImproperlyConfigured, match=r"^where must be a mapping"):
        validate_task_options(["lock_timeout"], "where")  # type: ignore[arg-type]


# ------------------------------------------------------------------ per app


def test_settings_are_cached_per_app(make_app: Any) -> None:
    """settings_for builds once per app and two apps keep their own settings."""
    first = make_app(singleton_lock_prefix="one")
    second = make_app(singleton_lock_prefix="two")
    assert settings_for(first) is settings_for(first)
    assert settings_for(first).prefix == "one"
    assert settings_for(second).prefix == "two"


def test_clear_settings_rereads_the_configuration(make_app: Any) -> None:
    """After clear_settings, the next settings_for reads app.conf again."""
    app = make_app(singleton_lock_prefix="before")
    assert settings_for(app).prefix == "before"
    app.conf.singleton_lock_prefix = "after"
    assert settings_for(app).prefix == "before"
    clear_settings(app)
    assert settings_for(app).prefix == "after"
    clear_settings()
    assert settings_for(app).prefix == "after"


def test_bad_settings_are_not_cached(make_app: Any) -> None:
    """A failed validation raises every time until the configuration is fixed."""
    app = make_app(singleton_lock_timeout=-1)
    for _ in range(2):
        with pytest.raises(ImproperlyConfigured):
            settings_for(app)
    app.conf.singleton_lock_timeout = 2
    assert settings_for(app).timeout == 2.0


def test_settings_for_is_thread_safe(make_app: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Many threads asking at once build the settings exactly once."""
    app = make_app()
    calls: list[int] = []
    original = config.read_settings
    start = threading.Barrier(16)

    def counting(conf: Any, hidden: Any = None) -> Settings:
        calls.append(1)
        return original(conf, hidden)

    monkeypatch.setattr(config, "read_settings", counting)
    results: list[Settings] = []

    def worker() -> None:
        start.wait()
        results.append(settings_for(app))

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1
    assert len({id(result) for result in results}) == 1


def test_settings_die_with_their_app() -> None:
    """The cache holds apps weakly, so a discarded app does not leak its settings."""
    app = Celery("ephemeral", set_as_current=False)
    settings_for(app)
    before = len(config._by_app)
    app.close()
    del app
    gc.collect()
    assert len(config._by_app) == before - 1


def test_queue_timeout_setting_and_option() -> None:
    """singleton_lock_queue_timeout sets the queued lease (default 1 h); a task's or a
    glob's lock_queue_timeout overrides it; non-positive values name the setting."""
    assert Settings().queue_timeout == 3600.0
    settings = read_settings(
        {
            "singleton_lock_queue_timeout": 120,
            "singleton_lock_tasks": {"reports.*": {"lock_queue_timeout": 30}},
        }
    )
    assert settings.queue_timeout == 120.0
    assert settings.options_for("reports.daily", None).queue_timeout == 30.0  # type: ignore[union-attr]
    assert settings.options_for("shop.buy", {"lock_queue_timeout": 5}).queue_timeout == 5.0  # type: ignore[union-attr]
    assert settings.options_for("shop.buy", {}).queue_timeout == 120.0  # type: ignore[union-attr]
    with pytest.raises(ImproperlyConfigured, match="singleton_lock_queue_timeout"):
        read_settings({"singleton_lock_queue_timeout": 0})
    with pytest.raises(ImproperlyConfigured, match="lock_queue_timeout"):
        Settings().options_for("shop.buy", {"lock_queue_timeout": -1})


def test_lease_floor_is_accepted_and_explained() -> None:
    """The shortest lease (0.5 s) is accepted; below it the error says the bound."""
    assert read_settings({"singleton_lock_timeout": 0.5}).timeout == 0.5
    with pytest.raises(ImproperlyConfigured, match=r"singleton_lock_timeout .*>= 0\.5"):
        read_settings({"singleton_lock_timeout": 0.001})


def test_slots_without_scripting_are_refused(make_app: Any) -> None:
    """lock_limit > 1 with singleton_lock_scripting = False is ImproperlyConfigured naming
    both, at first use of the task (and so at worker start)."""
    from celery_singleton_lock import LockedTask  # noqa: PLC0415 - wires the app on bind
    from celery_singleton_lock.runtime import locking_for  # noqa: PLC0415

    app = make_app(singleton_lock_scripting=False)

    @app.task(base=LockedTask, lock_limit=2, shared=False)
    def slotted(x: int) -> int:
        return x

    with pytest.raises(ImproperlyConfigured, match=r"lock_limit.*singleton_lock_scripting"):
        locking_for(app.tasks[slotted.name])


def test_replicas_setting_and_option() -> None:
    """singleton_lock_replicas (default 0) is the number of replicas a lock waits for; a
    task's or a glob's lock_replicas overrides it; a bad value names the option."""
    assert Settings().replicas == 0
    settings = read_settings(
        {"singleton_lock_replicas": 1, "singleton_lock_tasks": {"pay.*": {"lock_replicas": 2}}}
    )
    assert settings.replicas == 1
    assert settings.options_for("pay.charge", None).replicas == 2  # type: ignore[union-attr]
    assert settings.options_for("shop.buy", {"lock_replicas": 0}).replicas == 0  # type: ignore[union-attr]
    with pytest.raises(ImproperlyConfigured, match="lock_replicas must be an integer >= 0"):
        read_settings({"singleton_lock_tasks": {"pay.*": {"lock_replicas": -2}}})
