"""Fixtures of the ``celery locks`` tests: a prefix of each test's own, and the CLI runner."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from celery_singleton_lock.testing import RedisServer

ROOT = Path(__file__).resolve().parents[2]

Run = Callable[..., "subprocess.CompletedProcess[str]"]


@pytest.fixture
def prefix(client: redis.Redis) -> Iterator[str]:
    """A lock prefix of this test's own on the shared server; its keys are deleted after."""
    name = f"cli-{uuid.uuid4().hex[:10]}"
    yield name
    for pattern in (f"{name}:*", f"{name}-*", f"{{{name}*"):
        for found in client.scan_iter(match=pattern, count=500):
            client.delete(found)


@pytest.fixture
def run(redis_server: RedisServer, prefix: str) -> Run:
    """Run ``celery -A tests.cli.cliproj locks ARGS...``; returns the finished process."""

    def run_cli(
        *args: str, url: str | None = None, stdin: str | None = None, **env: str
    ) -> subprocess.CompletedProcess[str]:
        environ = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "CSL_CLI_URL": url or redis_server.url,
            "CSL_CLI_PREFIX": prefix,
            **env,
        }
        return subprocess.run(
            [sys.executable, "-m", "celery", "-A", "tests.cli.cliproj", "locks", *args],
            cwd=ROOT,
            env=environ,
            input=stdin,
            stdin=subprocess.DEVNULL if stdin is None else None,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )

    return run_cli
