"""The ``singleton_beat_*`` settings, read and refused at beat start (in process: building
the scheduler needs no Redis), and the catch-up option of an entry."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery
from celery.beat import PersistentScheduler
from celery.exceptions import ImproperlyConfigured

from celery_singleton_lock.beat import BeatConfigError, LeaderScheduler
from celery_singleton_lock.beat.config import entry_catch_up, read_beat_settings, reference_markdown
from celery_singleton_lock.beat.scheduler import EX_CONFIG, group_key


class MyScheduler(PersistentScheduler):
    """A user's own scheduler class."""


def scheduler(tmp_path: Any, max_interval: float | None = None, **conf: Any) -> LeaderScheduler:
    app = Celery("cfg", set_as_current=False)
    app.conf.update(broker_url="redis://127.0.0.1:1/0", **conf)
    return LeaderScheduler(
        app, schedule_filename=str(tmp_path / "schedule"), max_interval=max_interval, lazy=True
    )


def test_defaults(tmp_path: Any) -> None:
    """PersistentScheduler wrapped, a 10 s lease, catch-up once, the app's name as group;
    the loop never sleeps longer than a third of the lease."""
    found = scheduler(tmp_path)
    assert type(found.inner) is PersistentScheduler
    assert found.lease == 10.0
    assert found.beat.catch_up == "once"
    assert found.group == "cfg"
    assert found.keys.leader == group_key("csl", "cfg") == "csl:beat:{cfg}"
    assert found.max_interval == pytest.approx(10 / 3)


def test_settings_in_every_spelling(tmp_path: Any) -> None:
    """A class or its name, Django's upper-case spelling, a group name of one's own."""
    found = scheduler(
        tmp_path,
        SINGLETON_BEAT_SCHEDULER=f"{__name__}:MyScheduler",
        singleton_beat_lease=4,
        CELERY_SINGLETON_BEAT_CATCH_UP="skip",
        singleton_beat_name="billing",
    )
    assert type(found.inner) is MyScheduler
    assert (found.lease, found.beat.catch_up, found.group) == (4.0, "skip", "billing")
    assert type(scheduler(tmp_path, singleton_beat_scheduler=MyScheduler).inner) is MyScheduler


@pytest.mark.parametrize(
    ("conf", "max_interval", "named"),
    [
        ({"singleton_beat_scheduler": "nowhere.module:Nope"}, None, "singleton_beat_scheduler"),
        ({"singleton_beat_scheduler": "celery.app:Celery"}, None, "singleton_beat_scheduler"),
        ({"singleton_beat_scheduler": "celery_singleton_lock.beat:LeaderScheduler"}, None,
         "singleton_beat_scheduler"),
        ({"singleton_beat_lease": 0}, None, "singleton_beat_lease"),
        ({"singleton_beat_lease": "10"}, None, "singleton_beat_lease"),
        ({"singleton_beat_lease": float("nan")}, None, "singleton_beat_lease"),
        ({"singleton_beat_lease": 5}, 5.0, "singleton_beat_lease"),
        ({"singleton_beat_lease": 5, "beat_max_loop_interval": 30}, None, "beat_max_loop_interval"),
        ({"singleton_beat_catch_up": "all"}, None, "singleton_beat_catch_up"),
        ({"singleton_beat_name": "a{b}"}, None, "singleton_beat_name"),
        ({"singleton_beat_leese": 5}, None, "did you mean 'singleton_beat_lease'"),
    ],
)  # fmt: skip
def test_bad_settings_stop_beat_naming_the_setting(
    tmp_path: Any, conf: dict[str, Any], max_interval: float | None, named: str
) -> None:
    """Each bad value is refused as the scheduler is built, with exit status 78 and a
    message naming the setting."""
    with pytest.raises(BeatConfigError) as caught:
        scheduler(tmp_path, max_interval=max_interval, **conf)
    assert named in str(caught.value)
    assert caught.value.exit_code == EX_CONFIG
    assert isinstance(caught.value, ImproperlyConfigured)


def test_entry_catch_up_option() -> None:
    """An entry's ``options['catch_up']`` overrides the group's; a bad one names it."""
    assert entry_catch_up({"catch_up": "skip"}, "once", "e") == "skip"
    assert entry_catch_up({}, "once", "e") == "once"
    assert entry_catch_up(None, "skip", "e") == "skip"
    with pytest.raises(ImproperlyConfigured, match=r"beat_schedule\['e'\]"):
        entry_catch_up({"catch_up": "twice"}, "once", "e")


def test_a_bad_entry_option_stops_beat(tmp_path: Any) -> None:
    """Checked for every entry when the schedule is set up (not lazily)."""
    app = Celery("cfg", set_as_current=False)
    app.conf.update(
        broker_url="redis://127.0.0.1:1/0",
        beat_schedule={"e": {"task": "t", "schedule": 5, "options": {"catch_up": "twice"}}},
    )
    with pytest.raises(BeatConfigError, match="catch_up"):
        LeaderScheduler(app, schedule_filename=str(tmp_path / "s"))


def test_reference_table_names_every_setting() -> None:
    """The generated table of docs/beat.md has one row per setting."""
    table = reference_markdown()
    for name in ("scheduler", "lease", "catch_up", "name"):
        assert f"`singleton_beat_{name}`" in table
    assert read_beat_settings({}).lease == 10.0
