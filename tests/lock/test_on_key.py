"""``RedisLock.on_key``: the lock a task builds per run from one checked once per task. It
must be a lock like any other on its key: excluding, owner-checked, with the template's
lease and options, and with nothing of the template's (or another clone's) holds."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from celery_singleton_lock import RedisLock


def test_a_lock_on_another_key_takes_the_templates_arguments(
    client: redis.Redis, key: str, make_lock: Any
) -> None:
    template = make_lock(f"{key}:template", timeout=7.0, fallback_poll=0.25)
    lock = template.on_key(key, holder_info="run-1")
    assert (lock.name, lock.timeout, lock.fallback_poll, lock.scripting) == (
        key,
        7.0,
        0.25,
        template.scripting,
    )
    assert lock.acquire(blocking=False)
    holder = lock.holder()
    assert holder is not None
    assert holder.remaining_ms is not None
    assert 6000 < holder.remaining_ms <= 7000  # the template's lease
    assert holder.info == {"text": "run-1"}
    assert not template.owned()
    assert client.exists(template.name) == 0
    lock.release()


def test_locks_built_on_one_key_exclude_each_other_and_hold_their_own(
    client: redis.Redis, key: str, make_lock: Any
) -> None:
    template = make_lock(f"{key}:template")
    first, second = template.on_key(key), template.on_key(key)
    plain = make_lock(key)
    assert first.acquire(blocking=False)
    assert not second.acquire(blocking=False)
    assert not plain.acquire(blocking=False)
    assert first.owned()
    assert not second.owned()
    second.detach()  # holds nothing: nothing to forget
    assert first.owned()
    first.release()
    assert plain.acquire(blocking=False)
    assert not first.acquire(blocking=False)
    plain.release()


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"name": ""}, "lock name must be a non-empty string"),
        ({"name": "a}b"}, "hash tag"),
        ({"name": "k", "claim": "a:b"}, "claim must be a non-empty string without ':'"),
        ({"name": "k", "token": ""}, "token must be a non-empty string without ':'"),
        ({"name": "k", "unless_finished": 5}, "unless_finished must be a task id"),
    ],
)
def test_the_per_key_arguments_are_checked_as_the_constructor_checks_them(
    client: redis.Redis, given: dict[str, Any], message: str
) -> None:
    template = RedisLock(client, "template")
    name = given.pop("name")
    with pytest.raises(ValueError, match=message):
        template.on_key(name, **given)
    with pytest.raises(ValueError, match=message):
        RedisLock(client, name, **given)
