"""Deployments the lock must work in unchanged: Redis Cluster, ACL users, TLS and Sentinel
(a master, a replica and three Sentinels: ``benchmarks.sentinel.SentinelGroup``).

Every server here is a private ``redis-server`` on 127.0.0.1, started once per module where
start-up is costly, waited for with a bound, and stopped by PID.
"""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster

from benchmarks.sentinel import SentinelGroup
from celery_singleton_lock.testing import RedisServer, free_port

STARTUP_TIMEOUT = 20.0


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``predicate`` every 20 ms until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


# -- Redis Cluster ---------------------------------------------------------------------------


@dataclass
class Cluster:
    """Three master nodes on loopback, slots split by ``redis-cli --cluster create``."""

    nodes: list[RedisServer]

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    @property
    def url(self) -> str:
        """A startup URL for ``RedisCluster.from_url`` (any node will do)."""
        return f"redis://127.0.0.1:{self.ports[0]}/0"


def _cluster_ok(port: int) -> bool:
    with redis.Redis(port=port, socket_timeout=2) as node:
        info = node.execute_command("CLUSTER", "INFO")
    text = info.decode() if isinstance(info, bytes) else str(info)
    return "cluster_state:ok" in text


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A 3-master Redis Cluster for the whole module (it takes a few seconds to form)."""
    redis_cli = shutil.which("redis-cli")
    if redis_cli is None:
        pytest.skip("redis-cli is needed to create a cluster")
    workdir = tmp_path_factory.mktemp("cluster")
    nodes: list[RedisServer] = []
    try:
        for _ in range(3):
            port = free_port()
            node = RedisServer(
                port=port,
                extra_args=(
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", str(workdir / f"nodes-{port}.conf"),
                    # Explicit bus port: the default (port + 10000) may be taken or > 65535.
                    "--cluster-port", str(free_port()),
                ),
            )  # fmt: skip
            nodes.append(node)
            node.start()
        create = subprocess.run(
            [redis_cli, "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in nodes),
             "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert create.returncode == 0, create.stdout[-2000:] + create.stderr[-2000:]
        for node in nodes:
            wait_until(lambda p=node.port: _cluster_ok(p), STARTUP_TIMEOUT, "cluster_state:ok")
        yield Cluster(nodes)
    finally:
        for node in nodes:
            node.stop()


@pytest.fixture
def cluster_client(cluster: Cluster) -> Iterator[RedisCluster]:
    """A RedisCluster client on an emptied cluster (tests reuse fixed lock names)."""
    client = RedisCluster(host="127.0.0.1", port=cluster.ports[0], socket_timeout=10)
    client.flushall()  # sent to every primary
    yield client
    client.close()


# -- ACL ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def acl_server() -> Iterator[RedisServer]:
    """A private server for ACL tests (users are created and deleted per test)."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def admin(acl_server: RedisServer) -> Iterator[redis.Redis]:
    """The default (all-powerful) user of the ACL server, for setup and inspection."""
    client = redis.Redis(port=acl_server.port, socket_timeout=10)
    client.execute_command("SCRIPT", "FLUSH")  # so the first call takes the NOSCRIPT path
    client.execute_command("ACL", "LOG", "RESET")
    yield client
    for user in client.execute_command("ACL", "USERS"):
        name = user.decode() if isinstance(user, bytes) else user
        if name != "default":
            client.execute_command("ACL", "DELUSER", name)
    client.close()


# -- TLS ----------------------------------------------------------------------------------


@dataclass
class TlsFiles:
    """A throwaway CA and a server certificate for 127.0.0.1 signed by it."""

    ca: Path
    cert: Path
    key: Path


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(
        ["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, f"openssl {' '.join(args)}: {done.stderr[-2000:]}"


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """Generate the CA and a server certificate (SAN IP:127.0.0.1) with openssl."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make test certificates")
    where = tmp_path_factory.mktemp("tls")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
             "-subj", "/CN=celery-singleton-lock test CA", cwd=where)  # fmt: skip
    _openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr",
             "-subj", "/CN=127.0.0.1", cwd=where)  # fmt: skip
    (where / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "server.crt", "-days", "2", "-extfile", "san.cnf",
             cwd=where)  # fmt: skip
    return TlsFiles(ca=where / "ca.crt", cert=where / "server.crt", key=where / "server.key")


class TlsRedisServer(RedisServer):
    """A redis-server that listens only on a TLS port (``--port 0``); ``port`` is that port."""

    def __init__(self, files: TlsFiles) -> None:
        super().__init__()
        self.files = files
        self.extra_args = (
            "--port", "0",  # overrides RedisServer's plain-text --port: TLS only
            "--tls-port", str(self.port),
            "--tls-cert-file", str(files.cert),
            "--tls-key-file", str(files.key),
            "--tls-ca-cert-file", str(files.ca),
            "--tls-auth-clients", "no",
        )  # fmt: skip

    @property
    def url(self) -> str:
        """``rediss://`` URL that verifies the server certificate against the test CA."""
        return (
            f"rediss://127.0.0.1:{self.port}/0?ssl_cert_reqs=required&ssl_ca_certs={self.files.ca}"
        )

    def ping(self) -> bool:
        """PING over TLS (the plain-text probe of RedisServer would never succeed)."""
        context = ssl.create_default_context(cafile=str(self.files.ca))
        try:
            with (
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as raw,
                context.wrap_socket(raw, server_hostname="127.0.0.1") as sock,
            ):
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False


@pytest.fixture(scope="module")
def tls_server(tls_files: TlsFiles) -> Iterator[TlsRedisServer]:
    """A TLS-only redis-server whose certificate the test CA signed."""
    server = TlsRedisServer(tls_files)
    try:
        server.start()
    except RuntimeError as exc:  # a redis-server built without TLS refuses tls-port
        if "tls" in str(exc).lower():
            pytest.skip(f"this redis-server has no TLS support: {exc}")
        raise
    try:
        yield server
    finally:
        server.stop()


# -- Sentinel -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sentinel() -> Iterator[SentinelGroup]:
    """A master, one replica and three Sentinels (quorum 2) monitoring it as ``mymaster``,
    for the whole module (tests here never fail it over)."""
    with SentinelGroup(replicas=1, sentinels=3) as group:
        yield group


@pytest.fixture
def failover_group() -> Iterator[SentinelGroup]:
    """A fresh master, replica and three Sentinels for one test that kills the master."""
    with SentinelGroup(replicas=1, sentinels=3) as group:
        yield group


@pytest.fixture
def lagging_group() -> Iterator[SentinelGroup]:
    """Like ``failover_group``, with the replica replicating through a link the test can
    stall and cut (``group.links[0]``), so an acknowledged write can miss the replica."""
    with SentinelGroup(replicas=1, sentinels=3, stallable=True) as group:
        yield group
