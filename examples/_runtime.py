"""Process plumbing shared by the flash-sale demo and the runnable examples.

:class:`Stack` gives an example what it needs and takes all of it down again, however the
example ends (normally, with an error, Ctrl-C, SIGTERM or SIGHUP):

* a Redis: the URL the user gave (``--redis-url`` or ``REDIS_URL``), or else a private
  ``redis-server`` on a free loopback port (:class:`celery_singleton_lock.testing.RedisServer`);
* real ``celery worker`` (prefork) and ``celery beat`` processes, each started in a process
  group of its own, so a terminal's Ctrl-C reaches only the example, which then stops them
  group by group: SIGTERM (Celery's warm shutdown), SIGKILL to the group after a bounded wait.

Every wait here is bounded. On a Redis the user gave, examples work under a namespace unique
to the run and :meth:`Stack.forget` deletes those keys at the end; an embedded server is
simply thrown away.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any
from urllib.parse import urlsplit

import redis

from celery_singleton_lock.testing import (
    CeleryBeat,
    CeleryProcess,
    CeleryWorker,
    RedisServer,
)

__all__ = [
    "ROOT",
    "Stack",
    "add_redis_url_option",
    "guarded",
    "masked",
    "redis_url_from",
]

#: The repository root: put on PYTHONPATH so ``celery -A examples....`` finds the modules.
ROOT = Path(__file__).resolve().parents[1]
_CATCH = (signal.SIGTERM, signal.SIGHUP)
_Handler = Callable[[int, FrameType | None], Any] | int | None


def masked(url: str) -> str:
    """``url`` with its password replaced by ``**`` (for printing)."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    return parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":**@", 1)).geturl()


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGTERM / SIGHUP: leave the way Ctrl-C does, through every ``finally``."""
    raise KeyboardInterrupt(signal.Signals(signum).name)


@dataclass
class Stack:
    """A Redis plus the Celery processes of one example run; a context manager.

    ``redis_url=None`` starts an embedded private redis-server. ``echo`` receives one line
    per process started or stopped, with its PID, so a user (or a test) can check that
    nothing is left behind.
    """

    redis_url: str | None = None
    name: str = "example"
    echo: Callable[[str], None] = print
    stop_timeout: float = 10.0
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    services: list[CeleryProcess] = field(default_factory=list)
    server: RedisServer | None = None
    #: Key patterns deleted at close, on a Redis the user gave (see :meth:`forget`).
    forget_on_close: list[str] = field(default_factory=list)
    _logs: tempfile.TemporaryDirectory[str] | None = None
    _saved: dict[signal.Signals, _Handler] = field(default_factory=dict)

    # -- setup ---------------------------------------------------------------------------

    def __enter__(self) -> Stack:
        self._saved = {signum: signal.signal(signum, _interrupt) for signum in _CATCH}
        try:
            self._logs = tempfile.TemporaryDirectory(prefix=f"{self.name}-")
            if self.redis_url is None:
                self.server = RedisServer()
                # A terminal's Ctrl-C goes to our whole process group; the server must not
                # die before the workers that use it are stopped, so it starts (and stays)
                # with SIGINT blocked. SIGTERM from close() stops it as usual.
                mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
                try:
                    self.server.start()
                finally:
                    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                self.redis_url = self.server.url
                self.echo(f"started redis-server pid {self.server.pid} on {self.redis_url}")
            else:
                self.echo(f"using your Redis at {masked(self.redis_url)}")
                self.client().ping()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
            self.stop_timeout = min(self.stop_timeout, 5.0)  # the user is waiting: be brisk
        self.close()

    @property
    def url(self) -> str:
        """The Redis URL every process of this run uses."""
        if self.redis_url is None:
            raise RuntimeError("the stack is not started")
        return self.redis_url

    @property
    def embedded(self) -> bool:
        """True when the Redis is our own private server (safe to throw away)."""
        return self.server is not None

    def namespace(self, example: str) -> str:
        """Key prefix and queue name for this run: unique, so a shared Redis is safe."""
        return f"{example}:{self.run_id}"

    def client(self) -> redis.Redis:
        """A new client of the run's Redis (strings decoded)."""
        return redis.Redis.from_url(self.url, decode_responses=True, socket_timeout=10)

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """The environment of child processes: ours, REDIS_URL, the repo on PYTHONPATH."""
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        return {**os.environ, "REDIS_URL": self.url, "PYTHONPATH": path, **(extra or {})}

    # -- processes -------------------------------------------------------------------------

    def _logfile(self, name: str) -> Path:
        if self._logs is None:
            raise RuntimeError("the stack is not started")
        return Path(self._logs.name, f"{name}.log")

    def workers(
        self,
        app: str,
        *,
        count: int = 1,
        concurrency: int = 2,
        queue: str | None = None,
        env: dict[str, str] | None = None,
        ready_timeout: float = 60.0,
    ) -> list[CeleryProcess]:
        """Start ``count`` prefork workers of ``app`` at once; return when all are ready."""
        started: list[CeleryProcess] = []
        for index in range(1, count + 1):
            name = f"{self.name}-w{index}-{self.run_id}"
            worker = CeleryWorker(
                app, pool="prefork", concurrency=concurrency, hostname=f"{name}@%h",
                queues=[queue] if queue else [], env=self.env(env), cwd=ROOT,
                log_path=self._logfile(name),
            )  # fmt: skip
            self.services.append(worker)
            started.append(worker.start(wait=False))
        self.wait_ready(started, ready_timeout)
        return started

    def beat(
        self, app: str, *, label: str = "beat", env: dict[str, str] | None = None,
        wait: bool = True, ready_timeout: float = 30.0,
    ) -> CeleryProcess:  # fmt: skip
        """Start ``celery beat`` for ``app``; with ``wait``, return when its scheduler runs
        (else call :meth:`wait_ready`)."""
        log = self._logfile(f"{self.name}-{label}-{self.run_id}")
        service = CeleryBeat(
            app, schedule=log.with_name(f"{label}-schedule"), pidfile=log.with_name(f"{label}.pid"),
            env=self.env(env), cwd=ROOT, log_path=log, name=log.stem,
        )  # fmt: skip
        self.services.append(service)
        service.start(wait=False)
        if wait:
            self.wait_ready([service], ready_timeout)
        return service

    def wait_ready(self, services: Sequence[CeleryProcess], timeout: float = 60.0) -> None:
        """Wait (at most ``timeout`` s in all) until every service logged that it is ready."""
        deadline = time.monotonic() + timeout
        for service in services:
            service.wait_ready(max(0.0, deadline - time.monotonic()))
        for service in services:
            self.echo(f"started {service.name} pid {service.pid}")

    def stop(self, service: CeleryProcess, timeout: float = 10.0) -> None:
        """Stop one service (bounded; SIGTERM to its group) and forget it."""
        if service in self.services:
            self.services.remove(service)
        service.stop(timeout, group=True)
        self.echo(f"stopped {service.name} pid {service.pid}")

    # -- teardown --------------------------------------------------------------------------

    def forget(self, patterns: Sequence[str]) -> int:
        """On a Redis the user gave: delete the keys matching ``patterns`` (SCAN, never
        KEYS). On the embedded server this does nothing: the server is thrown away."""
        if self.embedded or self.redis_url is None:
            return 0
        deleted = 0
        with contextlib.closing(self.client()) as client:
            for pattern in patterns:
                batch = list(client.scan_iter(match=pattern, count=500))
                for start in range(0, len(batch), 500):
                    deleted += int(client.delete(*batch[start : start + 500]))
        return deleted

    def _say(self, line: str) -> None:
        """``echo`` that cannot break the cleanup (a closed pipe on stdout, say)."""
        with contextlib.suppress(OSError, ValueError):
            self.echo(line)

    def close(self) -> None:
        """Stop every process started, then the embedded Redis (idempotent).

        All services get SIGTERM at once and share one deadline, then SIGKILL. Signals
        are ignored meanwhile so a second Ctrl-C cannot cut the cleanup short; every step
        is bounded, so this always ends.
        """
        previous: dict[signal.Signals, _Handler] = {
            signum: signal.signal(signum, signal.SIG_IGN) for signum in (*_CATCH, signal.SIGINT)
        }
        try:
            services, self.services = self.services, []
            for service in services:
                service.terminate(group=True)
            deadline = time.monotonic() + self.stop_timeout
            for service in services:
                service.stop(max(0.0, deadline - time.monotonic()), terminate=False)
                self._say(f"stopped {service.name} pid {service.pid}")
            if self.forget_on_close and not self.embedded and self.redis_url is not None:
                try:
                    deleted = self.forget(self.forget_on_close)
                    self._say(f"deleted this run's {deleted} key(s) from your Redis")
                except redis.RedisError as exc:
                    self._say(f"could not delete this run's keys ({exc})")
            if self.server is not None:
                pid = self.server.pid
                self.server.stop()
                self.server = None
                if pid is not None:
                    self._say(f"stopped redis-server pid {pid}")
            if self._logs is not None:
                self._logs.cleanup()
                self._logs = None
        finally:
            for signum, handler in [*previous.items(), *self._saved.items()]:
                signal.signal(signum, handler)
            self._saved = {}


def guarded(body: Callable[[], int], say: Callable[[str], None] = print) -> int:
    """Run an example's ``body`` and turn how it ended into an exit status: its own on
    success, 130 on Ctrl-C / SIGTERM, 1 with a one-line reason when Redis or a process
    could not be started or reached (by then the stack has stopped what it started)."""
    try:
        return body()
    except KeyboardInterrupt:
        say("interrupted: every process the example started was stopped")
        return 130
    except (redis.RedisError, OSError, RuntimeError) as exc:
        say(f"error: {type(exc).__name__}: {exc}")
        return 1


def add_redis_url_option(parser: argparse.ArgumentParser, uses: str) -> None:
    """``--redis-url``, defaulting to ``$REDIS_URL`` and else to an embedded server (read
    the choice with :func:`redis_url_from`). ``--help`` never shows the URL, so a password
    in ``$REDIS_URL`` stays out of it."""
    parser.add_argument(
        "--redis-url",
        default=argparse.SUPPRESS,
        help=f"Redis for {uses} (default: $REDIS_URL; if unset, a private redis-server is "
        "started and stopped). On your Redis the example writes only under a namespace "
        "unique to the run and deletes those keys at the end.",
    )


def redis_url_from(args: argparse.Namespace) -> str | None:
    """The Redis URL to use: ``--redis-url``, else ``$REDIS_URL``, else None (embedded)."""
    given: str | None = getattr(args, "redis_url", None)
    return given or os.environ.get("REDIS_URL") or None
