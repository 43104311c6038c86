"""The Celery project the ``celery locks reap`` worker tests run real workers and the real
CLI against (``celery -A tests.cli.reapproj``).

Configured from the environment (each test has its own prefix and queues on the shared
server): ``CSL_CLI_URL`` is the broker and the lock Redis, ``CSL_CLI_PREFIX`` the lock
prefix and the stem of the queue names, ``CSL_REAP_REMOTE=0`` turns the workers' remote
control off, ``CSL_REAP_ROUTER=function`` routes through a router function. A test builds
the same app in its own process with :func:`make_app` to publish.

The app's lease (``singleton_lock_timeout``) is 6 s; ``reap.long`` leases 30 s and
``reap.triple`` 18 s (three times the app's), so neither renews within the app's third.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery

from celery_singleton_lock import LockedTask

URL = os.environ.get("CSL_CLI_URL", "redis://127.0.0.1:6399/0")
PREFIX = os.environ.get("CSL_CLI_PREFIX", "csl")
APP_TIMEOUT = 6.0


def default_queue(prefix: str) -> str:
    """The app's default queue (a test's own)."""
    return f"{prefix}-q"


def routed_queue(prefix: str) -> str:
    """The queue ``task_routes`` sends ``reap.routed`` to (no worker consumes it)."""
    return f"{prefix}-routed"


def started_key(prefix: str, tag: str) -> str:
    """The list a run of ``tag`` pushes its pid onto as its body starts."""
    return f"{prefix}-started:{tag}"


def go_key(prefix: str, tag: str) -> str:
    """The key that, once set, ends a run of ``tag`` early."""
    return f"{prefix}-go:{tag}"


def _router(name: str, args: Any, kwargs: Any, options: Any, task: Any = None, **kw: Any) -> Any:
    """A router function: its queues cannot be listed by reading the configuration."""
    return None


def make_app(url: str, prefix: str, *, remote_control: bool = True, router: str = "") -> Celery:
    """The project's app for ``url`` and ``prefix``, with its tasks."""
    app = Celery("reapproj", broker=url, set_as_current=False)
    app.conf.update(
        singleton_lock_url=url,
        singleton_lock_prefix=prefix,
        singleton_lock_timeout=APP_TIMEOUT,
        task_default_queue=default_queue(prefix),
        task_routes=(
            (_router,) if router == "function" else {"reap.routed": {"queue": routed_queue(prefix)}}
        ),
        worker_enable_remote_control=remote_control,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
    )
    data = redis.Redis.from_url(url)

    def run_for(tag: str, seconds: float) -> str:
        """Run ``seconds``, or until the test sets ``go_key`` (so a loaded machine's slow CLI
        calls never outlast the run)."""
        data.rpush(started_key(prefix, tag), os.getpid())
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not data.exists(go_key(prefix, tag)):
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        return "ran"

    @app.task(name="reap.long", base=LockedTask, lock_keys=["tag"], lock_timeout=30, shared=False)
    def long(tag: str, seconds: float) -> str:
        """Runs ``seconds`` under a 30 s lease (renewed every 10 s)."""
        return run_for(tag, seconds)

    @app.task(name="reap.triple", base=LockedTask, lock_keys=["tag"], lock_timeout=3 * APP_TIMEOUT,
              shared=False)  # fmt: skip
    def triple(tag: str, seconds: float) -> str:
        """Runs ``seconds`` under a lease three times the app's (renewed every 6 s)."""
        return run_for(tag, seconds)

    @app.task(name="reap.routed", base=LockedTask, lock_keys=["tag"], lock_scope="queue",
              shared=False)  # fmt: skip
    def routed(tag: str) -> str:
        """Locked at publish; routed to its own queue by ``task_routes``."""
        return tag

    @app.task(name="reap.queued", base=LockedTask, lock_keys=["tag"], lock_scope="queue",
              shared=False)  # fmt: skip
    def queued(tag: str) -> str:
        """Locked at publish; goes to the default queue unless a call says otherwise."""
        return tag

    return app


app = make_app(
    URL,
    PREFIX,
    remote_control=os.environ.get("CSL_REAP_REMOTE", "1") != "0",
    router=os.environ.get("CSL_REAP_ROUTER", ""),
)
