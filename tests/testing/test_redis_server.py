"""RedisServer, the private server every test uses: suites running side by side (the
version matrix beside the main run) may race for a free port; the loser moves on to
another port and never mistakes the winner's server for its own."""

from __future__ import annotations

import pytest
import redis

from celery_singleton_lock.testing import RedisServer


def test_a_taken_port_moves_the_server_to_another() -> None:
    with RedisServer() as first:
        second = RedisServer()
        second.port = first.port  # as if another process bound it after free_port()
        with second:
            assert second.port != first.port
            client = redis.Redis(host="127.0.0.1", port=second.port)
            assert client.info("server")["process_id"] == second.pid
            client.close()


def test_an_explicit_port_in_use_is_an_error() -> None:
    with RedisServer() as first, pytest.raises(RuntimeError, match="in use"):
        RedisServer(port=first.port).start()
