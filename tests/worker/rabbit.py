"""A private RabbitMQ node on free loopback ports, for the RabbitMQ-broker variant."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from celery_singleton_lock.testing import free_port

# Debian's /usr/sbin wrapper switches to the rabbitmq user; the real script runs as us.
SERVER = next(
    (
        p
        for p in ("/usr/lib/rabbitmq/bin/rabbitmq-server", "/usr/sbin/rabbitmq-server")
        if Path(p).exists()
    ),
    None,
)


class RabbitServer:
    """``rabbitmq-server`` with its own node name, ports and data dir; stopped by group."""

    def __init__(self) -> None:
        if SERVER is None:
            raise FileNotFoundError(
                "rabbitmq-server is not installed (Debian/Ubuntu: apt-get install rabbitmq-server; "
                "scripts/bootstrap.sh installs it when run as root)"
            )
        self.port = free_port()
        self._dir = tempfile.TemporaryDirectory(prefix="csl-rabbit-")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def start(self, timeout: float = 90.0) -> RabbitServer:
        base = Path(self._dir.name)
        (base / "mnesia").mkdir()
        (base / "log").mkdir()
        env = {
            **os.environ,
            "HOME": str(base),
            "RABBITMQ_NODENAME": f"csltest{self.port}@localhost",
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(free_port()),
            "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(base / "log"),
            "RABBITMQ_CONFIG_FILE": str(base / "none"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "plugins"),
            "RABBITMQ_PID_FILE": str(base / "pid"),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
        }
        with (base / "out.log").open("wb") as log:
            self.process = subprocess.Popen(
                [str(SERVER)], cwd=base, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError((base / "out.log").read_text(errors="replace")[-3000:])
            if "completed with" in (base / "out.log").read_text(errors="replace"):
                with (
                    contextlib.suppress(OSError),
                    socket.create_connection(("127.0.0.1", self.port), 1),
                ):
                    return self
            time.sleep(0.25)
        self.stop()
        raise TimeoutError("rabbitmq-server did not start")

    def stop(self) -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
            self.process = None
        self._dir.cleanup()
