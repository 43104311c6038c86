"""Real Celery processes for tests and demos: ``python -m celery`` in a process group
of its own (``CeleryProcess``), a worker and a beat on it, each ready-waited (bounded)
and stopped as a whole group.

This module starts Celery as a subprocess and never imports it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

__all__ = ["CeleryBeat", "CeleryProcess", "CeleryWorker", "process_group_alive"]


def _stat_fields(pid: int | str) -> list[str]:
    """Fields of ``/proc/PID/stat`` after the parenthesised command: state, ppid, pgrp, ..."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def process_group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` is still running (zombies do not count)."""
    if not Path("/proc/self/stat").exists():  # no procfs (macOS): ask the kernel instead
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = _stat_fields(stat.parent.name)
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                return True
    return False


class CeleryProcess:
    """``python -m celery <argv>`` in a process group of its own; a context manager.

    ``argv`` is what follows ``python -m celery``. ``env`` is laid over this process's
    environment. With ``log_path`` the process logs there (``--logfile``); its console
    output goes beside it (``<log_path>.out``), or, without ``log_path``, to a temporary
    directory removed by :meth:`close`. ``ready_marker`` is the text whose appearance in
    the log means "ready" (``None``: never wait).
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        ready_marker: str | None = None,
        ready_timeout: float = 60.0,
        name: str = "celery",
    ) -> None:
        self.argv = list(argv)
        self.env = dict(env or {})
        self.cwd = cwd
        self.log_path = Path(log_path) if log_path is not None else None
        self.ready_marker = ready_marker
        self.ready_timeout = ready_timeout
        self.name = name
        self.process: subprocess.Popen[bytes] | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def command(self) -> list[str]:
        """The full command line."""
        logfile = ["--logfile", str(self.log_path)] if self.log_path is not None else []
        return [sys.executable, "-m", "celery", *self.argv, *logfile]

    @property
    def console_path(self) -> Path:
        """Where the process's stdout and stderr go."""
        if self.log_path is not None:
            return self.log_path.with_suffix(".out")
        if self._dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix="csl-celery-")
        return Path(self._dir.name, f"{self.name}.out")

    @property
    def pid(self) -> int:
        """PID of the main process, which is also the process group id."""
        if self.process is None:
            raise RuntimeError(f"{self.name} is not started")
        return self.process.pid

    def start(self, *, wait: bool = True) -> CeleryProcess:
        """Start the process; with ``wait``, return once it is ready (:meth:`wait_ready`)."""
        console = self.console_path.open("wb")
        try:
            self.process = subprocess.Popen(
                self.command,
                cwd=self.cwd,
                env={**os.environ, **self.env},
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            console.close()
        if wait:
            try:
                self.wait_ready()
            except BaseException:
                self.stop()
                raise
        return self

    def alive(self) -> bool:
        """Whether the main process still runs."""
        return self.process is not None and self.process.poll() is None

    def log(self) -> str:
        """Everything the process logged so far: its log file, then its console output."""
        text = ""
        for path in (self.log_path, self.console_path):
            if path is not None and path.exists():
                text += path.read_text(errors="replace")
        return text

    def tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of :meth:`log`, for error messages."""
        return "\n".join(self.log().splitlines()[-lines:])

    def ready(self) -> bool:
        """Whether the ready marker appeared in the log (always True without a marker)."""
        return self.ready_marker is None or self.ready_marker in self.log()

    def wait_ready(self, timeout: float | None = None) -> None:
        """Wait at most ``timeout`` s (default ``ready_timeout``) until :meth:`ready`;
        ``RuntimeError`` if the process exits first, ``TimeoutError`` if time runs out."""
        deadline = time.monotonic() + (self.ready_timeout if timeout is None else timeout)
        while not self.ready():
            if not self.alive():
                raise RuntimeError(f"{self.name} exited at start:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} not ready:\n{self.tail()}")
            time.sleep(0.05)

    def children(self) -> list[int]:
        """PIDs of the main process's direct children (a prefork worker's pool), from /proc."""
        if self.process is None:
            return []
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    if int(_stat_fields(entry.name)[1]) == self.process.pid:
                        found.append(int(entry.name))
        return found

    def terminate(self, *, group: bool = False) -> None:
        """SIGTERM (Celery's warm shutdown) to the main process, or to every process of the
        group with ``group=True`` (as a process manager does)."""
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(self.process.pid, signal.SIGTERM)
            else:
                self.process.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 15.0, *, terminate: bool = True, group: bool = False) -> None:
        """SIGTERM (see :meth:`terminate`; skipped with ``terminate=False``), wait at most
        ``timeout`` s for the main process, then SIGKILL the group; return once no process
        of the group is left (bounded). Idempotent."""
        if self.process is None:
            return
        if terminate:
            self.terminate(group=group)
        try:
            self.process.wait(timeout=max(0.0, timeout))
        except subprocess.TimeoutExpired:
            self.kill()
        self._reap_group(self.process.pid)

    def kill(self) -> None:
        """SIGKILL every process of the group at once; return once none is left (bounded)."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)
        self._reap_group(self.process.pid)

    @staticmethod
    def _reap_group(pgid: int) -> None:
        """A pool child that outlived its parent would still be in the group: none may stay."""
        deadline = time.monotonic() + 5
        while process_group_alive(pgid) and time.monotonic() < deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            time.sleep(0.05)

    def close(self) -> None:
        """:meth:`stop`, then remove the temporary directory of the console output, if any."""
        self.stop()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> CeleryProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _app_args(app_module: str, broker_url: str | None) -> list[str]:
    return ["-A", app_module, *(["--broker", broker_url] if broker_url else [])]


class CeleryWorker(CeleryProcess):
    """``celery -A <app_module> worker``, ready once it logs `` ready.`` (INFO level).

    Gossip, mingle and heartbeat are off by default (``without``): they only slow a test
    worker's start. ``broker_url`` is passed as ``--broker`` (else the app's own).
    """

    def __init__(
        self,
        app_module: str,
        *,
        broker_url: str | None = None,
        pool: str = "prefork",
        concurrency: int = 2,
        hostname: str | None = None,
        loglevel: str = "INFO",
        queues: Iterable[str] = (),
        without: Iterable[str] = ("gossip", "mingle", "heartbeat"),
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        ready_timeout: float = 60.0,
    ) -> None:
        queue_list = ",".join(queues)
        argv = [
            *_app_args(app_module, broker_url),
            "worker",
            "--pool",
            pool,
            "--concurrency",
            str(concurrency),
            *(["--hostname", hostname] if hostname else []),
            "--loglevel",
            loglevel,
            *(f"--without-{feature}" for feature in without),
            *(["--queues", queue_list] if queue_list else []),
            *extra_args,
        ]
        super().__init__(
            argv,
            env=env,
            cwd=cwd,
            log_path=log_path,
            ready_marker=" ready.",
            ready_timeout=ready_timeout,
            name=(hostname or "worker").split("@")[0],
        )

    def __enter__(self) -> CeleryWorker:
        self.start()
        return self


class CeleryBeat(CeleryProcess):
    """``celery -A <app_module> beat``, ready once its scheduler starts (``beat: Starting``).

    ``schedule`` is the schedule file (default: one in a temporary directory); ``pidfile``
    ``""`` writes none.
    """

    def __init__(
        self,
        app_module: str,
        *,
        broker_url: str | None = None,
        schedule: str | os.PathLike[str] | None = None,
        pidfile: str | os.PathLike[str] = "",
        max_interval: float | None = None,
        loglevel: str = "INFO",
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        ready_timeout: float = 30.0,
        name: str = "beat",
    ) -> None:
        super().__init__(
            [],
            env=env,
            cwd=cwd,
            log_path=log_path,
            ready_marker="beat: Starting",
            ready_timeout=ready_timeout,
            name=name,
        )
        if schedule is None:
            schedule = self.console_path.with_name(f"{name}-schedule")
        self.argv = [
            *_app_args(app_module, broker_url),
            "beat",
            "--loglevel",
            loglevel,
            "--schedule",
            str(schedule),
            "--pidfile",
            str(pidfile),
            *(["--max-interval", f"{max_interval:g}"] if max_interval is not None else []),
            *extra_args,
        ]

    def __enter__(self) -> CeleryBeat:
        self.start()
        return self
