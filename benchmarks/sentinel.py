"""A real Redis Sentinel deployment on loopback, for the failover tests and benchmark.

:class:`SentinelGroup` starts a master, its replicas and three Sentinels (quorum 2), each a
private ``redis-server`` on a free port, waits (bounded) until every Sentinel knows the
replicas and the other Sentinels, and stops every process it started, by PID. It can kill
the master (SIGKILL) and wait for the Sentinels to promote a replica.

With ``link_delay`` (seconds) or ``stallable=True``, each replica replicates through a
:class:`ReplicationLink` (a loopback TCP proxy) that delays every byte by that much, as a
network between two hosts would, and that a test can stall (bytes held) and cut (bytes
held so far thrown away), so a write the master acknowledged never reaches the replica.
Sentinel reconfigures a replica that replicates from an address other than the master's
only after ``failover-timeout``; a group with a link uses a long one (60 s) so the link
stays in place for its lifetime.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import redis

from celery_singleton_lock.testing import FaultProxy, RedisServer

__all__ = ["MASTER_NAME", "ReplicationLink", "SentinelGroup", "SentinelProcess"]

MASTER_NAME = "mymaster"
STARTUP_TIMEOUT = 30.0


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)


class ReplicationLink(FaultProxy):
    """A :class:`FaultProxy` (stall, resume, cut) that also delays every chunk by ``delay``
    seconds, order kept. One reading and one writing thread per direction and connection."""

    def __init__(self, upstream_port: int, delay: float = 0.0) -> None:
        self.delay = delay
        super().__init__(upstream_port)

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        """Read from ``source``; a second thread writes each chunk to ``sink`` once it is
        ``delay`` old and bytes may flow."""
        pending: list[tuple[float, int, bytes]] = []
        order = itertools.count()
        ready = threading.Condition()
        done = threading.Event()

        def write() -> None:
            try:
                while True:
                    with ready:
                        while not pending and not done.is_set():
                            ready.wait(0.1)
                        if not pending:
                            return
                        due, _, chunk = pending[0]
                        wait = due - time.monotonic()
                        if wait > 0:
                            ready.wait(wait)
                            continue
                        heapq.heappop(pending)
                    while not self._flowing.wait(0.1):
                        if self._closed or sink.fileno() < 0:
                            return
                    sink.sendall(chunk)
            except OSError:
                pass
            finally:
                for sock in (source, sink):
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        try:
            while data := source.recv(65536):
                with ready:
                    heapq.heappush(pending, (time.monotonic() + self.delay, next(order), data))
                    ready.notify()
        except OSError:
            pass
        finally:
            done.set()
            with ready:
                ready.notify()


class SentinelProcess(RedisServer):
    """``redis-server <conf> --sentinel`` monitoring ``127.0.0.1:<master_port>``."""

    def __init__(
        self, master_port: int, *, quorum: int, down_after_ms: int, failover_timeout_ms: int
    ) -> None:
        super().__init__()
        self.master_port = master_port
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.workdir: tempfile.TemporaryDirectory[str] | None = None

    def start(self) -> SentinelProcess:
        """Write the config (Sentinel rewrites it, so it must be a file) and start."""
        self.workdir = tempfile.TemporaryDirectory(prefix="csl-sentinel-")
        conf = Path(self.workdir.name, "sentinel.conf")
        conf.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {self.workdir.name}\n"
            f"sentinel monitor {MASTER_NAME} 127.0.0.1 {self.master_port} {self.quorum}\n"
            f"sentinel down-after-milliseconds {MASTER_NAME} {self.down_after_ms}\n"
            f"sentinel failover-timeout {MASTER_NAME} {self.failover_timeout_ms}\n"
            f"sentinel parallel-syncs {MASTER_NAME} 1\n"
        )
        log = Path(self.workdir.name, "sentinel.log").open("wb")  # noqa: SIM115
        self.process = subprocess.Popen(
            [self.executable, str(conf), "--sentinel", "--loglevel", "notice"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        try:
            _wait(self.ping, self.startup_timeout, "a sentinel to answer")
        except BaseException:
            self.stop()
            raise
        return self

    def log(self) -> str:
        """What the sentinel logged (its events: +sdown, +odown, +switch-master, ...)."""
        if self.workdir is None:
            return ""
        return Path(self.workdir.name, "sentinel.log").read_text(errors="replace")

    def master(self) -> dict[str, str]:
        """``SENTINEL MASTER mymaster`` as a dict of str."""
        with redis.Redis(port=self.port, socket_timeout=2, decode_responses=True) as client:
            state: dict[str, str] = client.execute_command("SENTINEL", "MASTER", MASTER_NAME)
        return state

    def master_port_now(self) -> int:
        """The port this sentinel says the master has now."""
        with redis.Redis(port=self.port, socket_timeout=2, decode_responses=True) as client:
            _, port = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME)
        return int(port)

    def stop(self, timeout: float = 5.0) -> None:
        super().stop(timeout)
        if self.workdir is not None:
            self.workdir.cleanup()
            self.workdir = None


class SentinelGroup:
    """A master, ``replicas`` replicas and ``sentinels`` Sentinels (quorum 2) on loopback;
    a context manager. ``nodes`` maps port to server for every data node started."""

    def __init__(
        self,
        *,
        replicas: int = 1,
        sentinels: int = 3,
        quorum: int = 2,
        down_after_ms: int = 1000,
        failover_timeout_ms: int | None = None,
        link_delay: float | None = None,
        stallable: bool = False,
    ) -> None:
        self.replica_count = replicas
        self.sentinel_count = sentinels
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        linked = link_delay is not None or stallable
        self.failover_timeout_ms = failover_timeout_ms or (60_000 if linked else 10_000)
        self.link_delay = (link_delay or 0.0) if linked else None
        self.nodes: dict[int, RedisServer] = {}
        self.links: list[ReplicationLink] = []
        self.sentinels: list[SentinelProcess] = []
        self.first_master: RedisServer | None = None

    # -- life cycle --------------------------------------------------------------------

    def start(self) -> SentinelGroup:
        try:
            master = RedisServer().start()
            self.first_master = master
            self.nodes[master.port] = master
            for _ in range(self.replica_count):
                upstream = master.port
                if self.link_delay is not None:
                    link = ReplicationLink(master.port, self.link_delay)
                    self.links.append(link)
                    upstream = link.port
                replica = RedisServer(extra_args=("--replicaof", "127.0.0.1", str(upstream)))
                replica.start()
                self.nodes[replica.port] = replica
            for port in list(self.nodes)[1:]:
                self.wait_synced(port)
            for _ in range(self.sentinel_count):
                watcher = SentinelProcess(
                    master.port, quorum=self.quorum, down_after_ms=self.down_after_ms,
                    failover_timeout_ms=self.failover_timeout_ms,
                )  # fmt: skip
                self.sentinels.append(watcher.start())
            self.wait_settled()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every sentinel, data node and link this group started."""
        for watcher in self.sentinels:
            watcher.stop()
        for node in self.nodes.values():
            node.stop()
        for link in self.links:
            link.close()

    def __enter__(self) -> SentinelGroup:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- state ------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """``sentinel://`` URL naming every sentinel, for ``singleton_lock_url``."""
        hosts = ";".join(f"sentinel://127.0.0.1:{s.port}" for s in self.sentinels)
        return f"{hosts}/0?master_name={MASTER_NAME}"

    @staticmethod
    def _link_up(port: int) -> bool:
        with redis.Redis(port=port, socket_timeout=1) as client:
            info = client.info("replication")
        return bool(info.get("master_link_status") == "up")

    def wait_synced(self, port: int, timeout: float = STARTUP_TIMEOUT) -> None:
        """Until the replica on ``port`` has its link to the master up (a full sync waits
        ``repl-diskless-sync-delay``, 5 s by default, for more replicas to join)."""

        def synced() -> bool:
            return self._link_up(port)

        _wait(synced, timeout, "a replica to sync")

    def _settled(self) -> bool:
        for watcher in self.sentinels:
            try:
                state = watcher.master()
            except redis.RedisError:
                return False
            if (
                state.get("flags") != "master"
                or int(state.get("num-slaves", 0)) < self.replica_count
                or int(state.get("num-other-sentinels", 0)) < self.sentinel_count - 1
            ):
                return False
        return True

    def wait_settled(self, timeout: float = STARTUP_TIMEOUT) -> None:
        """Until every sentinel sees a healthy master, every replica and every other
        sentinel (they find each other through the master every 2 s)."""
        _wait(self._settled, timeout, "the sentinels to agree on the deployment")

    def master_port(self) -> int:
        """The master's port, as the first sentinel that answers says."""
        for watcher in self.sentinels:
            with contextlib.suppress(redis.RedisError):
                return watcher.master_port_now()
        raise RuntimeError("no sentinel answers")

    def master(self) -> RedisServer:
        return self.nodes[self.master_port()]

    # -- faults -----------------------------------------------------------------------------

    def kill_master(self) -> int:
        """SIGKILL the master process; its port."""
        port = self.master_port()
        node = self.nodes[port]
        assert node.process is not None
        node.process.kill()
        node.process.wait(timeout=10)
        return port

    def wait_failover(self, old_port: int, timeout: float | None = None) -> int:
        """Until every sentinel names a new master that says it is one; its port.

        By default the wait covers a failover whose first election failed (on a busy
        machine the sentinels can split their votes): a sentinel tries again only after
        twice ``failover-timeout``, so the bound is that plus 30 s."""
        if timeout is None:
            timeout = 2 * self.failover_timeout_ms / 1000 + 30.0

        def promoted() -> bool:
            try:
                ports = {watcher.master_port_now() for watcher in self.sentinels}
            except redis.RedisError:
                return False
            if len(ports) != 1 or old_port in ports:
                return False
            with redis.Redis(port=ports.pop(), socket_timeout=1, decode_responses=True) as node:
                return bool(node.info("replication").get("role") == "master")

        _wait(promoted, timeout, "the sentinels to promote a replica")
        return self.master_port()
