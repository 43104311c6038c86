"""task_always_eager: the call runs in-process through the same lock (documented)."""

from __future__ import annotations

import pytest
import redis
from celery import Celery

from celery_singleton_lock import LockedTask, RedisLock, current_lock
from celery_singleton_lock.keys import task_lock_key
from celery_singleton_lock.testing import RedisServer


@pytest.fixture
def eager_app(redis_server: RedisServer) -> Celery:
    """An app in eager mode whose lock Redis is the private test server."""
    app = Celery("eager", broker="memory://", set_as_current=False)
    app.conf.update(task_always_eager=True, singleton_lock_url=redis_server.url)
    return app


def test_eager_call_is_locked_and_released(eager_app: Celery, client: redis.Redis) -> None:
    """An eager call holds the lock while its body runs (fencing token visible), releases
    it afterwards, and is skipped while someone else holds the same key."""

    @eager_app.task(base=LockedTask, lock_keys=["sku"], name="eager.buy")
    def buy(sku: str, user: int) -> int | None:
        held = current_lock()
        assert held is not None
        assert held.owned()
        return held.fencing_token

    assert isinstance(buy.delay("a", 1).get(), int)
    key = task_lock_key("csl", "eager.buy", buy.run, ("a", 1), {}, ("sku",))
    assert not client.exists(key)
    other = RedisLock(client, key, timeout=10)
    assert other.acquire()
    assert buy.delay("a", 2).get() is None
    other.release()
