"""The lock, unchanged, on Redis Cluster, as an ACL user, over TLS and through Sentinel.

The ACL user here may run only the commands the engine declares (``ACL_COMMANDS``: its
scripting and plain commands, and ``ping``) on the key patterns ``~csl:*`` and ``~{csl:*``
(``csl`` is the default key prefix of the Celery layer, whose keys look like
``csl:shop.buy:{3f2a…}``; a bare ``RedisLock`` name ``csl:x`` keeps its companions under
``{csl:x}:``). The full least-privilege ACL, modes included, is generated from the code
into docs/deployment.md.

``test_acl_every_granted_command_is_needed`` shows each command above is required by its mode.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException

from benchmarks.sentinel import SentinelGroup
from celery_singleton_lock import LockError, RedisLock
from celery_singleton_lock.client import client_from_url
from celery_singleton_lock.engine.keyspace import companion_key
from celery_singleton_lock.engine.value import format_value
from celery_singleton_lock.exceptions import LockBackendError
from tests.deploy.conftest import Cluster, TlsRedisServer, wait_until
from tests.lock.hammer import run_hammer

pytestmark = pytest.mark.slow

SCRIPTING_COMMANDS = (
    "evalsha", "script|load", "time", "get", "set", "setrange", "pttl", "pexpire", "del",
    "rpush", "blpop", "lpop", "zadd", "zrem", "zpopmin", "zcard",
)  # fmt: skip
PLAIN_COMMANDS = (
    "time", "get", "set", "getset", "pttl", "pexpire", "del", "rpush", "blpop", "lpop",
    "zadd", "zrem", "watch", "unwatch", "multi", "exec",
)  # fmt: skip
ACL_COMMANDS = (*dict.fromkeys(SCRIPTING_COMMANDS + PLAIN_COMMANDS), "ping")
ACL_KEYS = ("~csl:*", "~{csl:*")

# Names with and without hash tags; on the 3-node cluster they land on all three masters.
CLUSTER_NAMES = ("orders:sku-42", "{lock_goods}:300", "billing:invoice-7", "csl:shop.buy:{3f2a9c}")

MODES = [pytest.param(True, id="scripting"), pytest.param(False, id="plain")]
CLUSTER_MODES = [
    pytest.param(True, id="scripting"),
    pytest.param(False, id="plain"),
]


def cluster_client_from_url(url: str) -> RedisCluster:
    """Client factory for the hammer's worker processes (top-level, so picklable)."""
    return RedisCluster.from_url(url)


def blocked_clients(probe: Any, key: str) -> int:
    """How many connections are blocked (BLPOP) on the server that holds ``key``."""
    if isinstance(probe, RedisCluster):
        info = probe.info("clients", target_nodes=probe.get_node_from_key(key))
    else:
        info = probe.info("clients")
    return int(info["blocked_clients"])


def handoff_delay(make: Callable[[], RedisLock], probe: Any) -> float:
    """Seconds from a release to the moment a waiter blocked on the lock holds it."""
    holder, waiter = make(), make()
    assert holder.acquire(blocking=False)
    woke: list[float] = []
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            if waiter.acquire(timeout=45):
                woke.append(time.monotonic())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    try:
        wait_until(
            lambda: bool(errors) or blocked_clients(probe, waiter.signal_key) > 0,
            30,
            "the waiter to block on its signal list",
        )
    finally:
        if errors:
            thread.join(timeout=1)
            raise errors[0]
    released = time.monotonic()
    holder.release()
    thread.join(timeout=60)
    assert not thread.is_alive()
    if errors:
        raise errors[0]
    assert woke, "the waiter never got the lock"
    waiter.release()
    return woke[0] - released


def assert_notified_handoff(make: Callable[[], RedisLock], probe: Any) -> None:
    """A blocked waiter is woken by the release. ``make`` gives locks with a 120 s lease
    and a 60 s fallback poll, and the waiter gives up after 45 s: neither the holder's lease
    nor its poll can let it in, so getting the lock at all proves the wake-up (in practice
    within milliseconds; no bound on that here, as a loaded machine stretches it)."""
    handoff_delay(make, probe)


def exercise_basics(make: Callable[..., RedisLock]) -> None:
    """Acquire, exclude a rival, extend, owned/locked/holder, release, rival takes over."""
    lock, rival = make(), make()
    assert lock.acquire(blocking=False)
    assert lock.fencing_token
    assert not rival.acquire(blocking=False)
    lock.extend(5)
    assert lock.owned()
    assert lock.locked()
    holder = lock.holder()
    assert holder is not None
    assert holder.token == lock.token
    assert not rival.owned()
    lock.release()
    assert not lock.locked()
    assert rival.acquire(blocking=False)
    rival.release()


# -- Redis Cluster ---------------------------------------------------------------------------


def test_cluster_names_spread_over_nodes_with_signal_in_their_slot(
    cluster_client: RedisCluster,
) -> None:
    """Tagged and untagged names land on different masters, each signal list in its slot."""
    nodes = {cluster_client.get_node_from_key(name).name for name in CLUSTER_NAMES}
    assert len(nodes) == 3
    for name in CLUSTER_NAMES:
        signal = companion_key(name, "signal")
        assert cluster_client.keyslot(signal) == cluster_client.keyslot(name)


@pytest.mark.parametrize("scripting", CLUSTER_MODES)
def test_cluster_acquire_extend_release(
    cluster: Cluster, cluster_client: RedisCluster, scripting: bool
) -> None:
    """On every name the lock excludes a rival, extends and releases, stored on its node."""
    for name in CLUSTER_NAMES:
        lock = RedisLock(cluster_client, name, timeout=10, scripting=scripting)
        rival = RedisLock(cluster_client, name, timeout=10, scripting=scripting)
        assert lock.acquire(blocking=False)
        assert not rival.acquire(blocking=False)
        owner = cluster_client.get_node_from_key(name)
        with redis.Redis(host=owner.host, port=owner.port) as node:
            assert lock.token.encode() in node.get(name)  # a wrong node would answer MOVED
        lock.extend(20)
        assert 20_000 < cluster_client.pttl(name) <= 23_000  # lease + the key's grace
        lock.release()
        assert cluster_client.get(name) is None
        assert rival.acquire(blocking=False)
        rival.release()


@pytest.mark.parametrize("scripting", MODES)
def test_cluster_owned_locked_holder(cluster_client: RedisCluster, scripting: bool) -> None:
    """owned(), locked() and holder() answer on a cluster as on a single Redis."""
    for name in CLUSTER_NAMES:
        exercise_basics(
            lambda name=name: RedisLock(cluster_client, name, timeout=10, scripting=scripting)
        )


@pytest.mark.parametrize("scripting", CLUSTER_MODES)
def test_cluster_notified_handoff(cluster_client: RedisCluster, scripting: bool) -> None:
    """A release wakes the waiter on another thread, on every node."""
    for name in CLUSTER_NAMES:
        assert_notified_handoff(
            lambda name=name: RedisLock(
                cluster_client, name, timeout=120, scripting=scripting, fallback_poll=60
            ),
            cluster_client,
        )


@pytest.mark.parametrize("scripting", CLUSTER_MODES)
def test_cluster_waiter_that_times_out_leaves_the_queue(
    cluster_client: RedisCluster, scripting: bool
) -> None:
    """On a Redis Cluster a blocking acquire that times out returns False and leaves the
    waiters' queue, and a queued waiter that gets the lock leaves it too (each with
    single-key commands: a multi-key DELETE in a cluster pipeline raised
    RedisClusterException; found by the slot-migration test)."""
    for name in CLUSTER_NAMES:
        queue = companion_key(name, "queue")
        holder = RedisLock(cluster_client, name, timeout=10, scripting=scripting)
        assert holder.acquire(blocking=False)
        waiter = RedisLock(cluster_client, name, timeout=10, scripting=scripting)
        assert not waiter.acquire(timeout=0.3)
        assert cluster_client.zcard(queue) == 0
        got: list[bool] = []
        thread = threading.Thread(
            target=lambda w=waiter, out=got: out.append(w.acquire(timeout=10))
        )
        thread.start()
        time.sleep(0.3)  # queued
        holder.release()
        thread.join(10)
        assert got == [True]
        assert cluster_client.zcard(queue) == 0
        waiter.release()


def test_cluster_pipeline_watch_needs_a_transaction_pipeline(
    cluster_client: RedisCluster,
) -> None:
    """redis-py's RedisCluster refuses WATCH on pipeline() but supports it, on one slot,
    with pipeline(transaction=True), where a concurrent write aborts EXEC."""
    name = "{lock_goods}:300"
    with cluster_client.pipeline() as plain, pytest.raises(RedisClusterException):
        plain.watch(name)
    with cluster_client.pipeline(transaction=True) as pipe:
        pipe.watch(name)
        assert pipe.get(name) is None
        cluster_client.set(name, "someone else")
        pipe.multi()
        pipe.set(name, "mine")
        with pytest.raises(redis.WatchError):
            pipe.execute()
    with cluster_client.pipeline(transaction=True) as pipe:
        pipe.watch(name)
        pipe.get(name)
        pipe.multi()
        pipe.delete(name)
        pipe.rpush(companion_key(name, "signal"), "1")
        assert pipe.execute() == [1, 1]


@pytest.mark.parametrize("scripting", CLUSTER_MODES)
def test_cluster_hammer(cluster: Cluster, cluster_client: RedisCluster, scripting: bool) -> None:
    """8 processes × 25 non-atomic increments through cluster clients: no overlap, no loss."""
    result = run_hammer(
        cluster.url, "orders:sku-42", scripting=scripting, client_factory=cluster_client_from_url
    )
    assert result.overlaps == 0
    assert result.counter == result.expected
    assert result.fences_increasing


# -- ACL user ------------------------------------------------------------------------------


def set_user(
    admin: redis.Redis, user: str, commands: tuple[str, ...], keys: tuple[str, ...]
) -> str:
    """(Re)create ``user`` with exactly ``commands`` on ``keys``; return its URL."""
    admin.execute_command("ACL", "DELUSER", user)
    admin.execute_command(
        "ACL", "SETUSER", user, "on", ">secret", "resetkeys", *keys, "resetchannels", "-@all",
        *(f"+{command}" for command in commands),
    )  # fmt: skip
    port = admin.connection_pool.connection_kwargs["port"]
    return f"redis://{user}:secret@127.0.0.1:{port}/0"


def lock_scenario(url: str, admin: redis.Redis, scripting: bool) -> None:
    """Every protocol path of one mode, as the user of ``url``; ``admin`` only observes."""
    client = client_from_url(url)
    try:
        name = f"csl:{uuid.uuid4().hex[:8]}"

        def make(**kwargs: Any) -> RedisLock:
            kwargs.setdefault("timeout", 10)
            return RedisLock(client, kwargs.pop("name", name), scripting=scripting, **kwargs)

        exercise_basics(make)
        # An expired lease is taken over (the GETSET path in plain mode): a crashed holder's
        # value whose expiry is past on the server clock while its key still has a TTL.
        past = int(admin.time()[0]) * 1000 - 500
        admin.set(name, format_value(past, False, "crashed", 7, ""), px=60_000)
        late = make(fallback_poll=5)
        assert late.acquire(blocking=False)
        assert (late.fencing_token or 0) > 7
        late.release()
        assert_notified_handoff(lambda: make(timeout=120, fallback_poll=60), admin)
        # A waiter that gives up leaves the queue (ZREM, LPOP of a grant that raced it).
        holder, quitter = make(), make(fallback_poll=5)
        assert holder.acquire(blocking=False)
        assert not quitter.acquire(timeout=0.3)
        holder.release()
        assert admin.get(name) is None
        # A foreign value with a TTL counts as held until it expires (the PTTL path).
        tagged = f"{{csl:{uuid.uuid4().hex[:8]}}}:job"
        admin.set(tagged, "not ours", px=60_000)
        foreign = make(name=tagged)
        assert not foreign.acquire(blocking=False)
        admin.pexpire(tagged, 200)  # it runs out while the caller waits
        assert foreign.acquire(timeout=30)
        foreign.release()
    finally:
        client.close()


def acl_denials(admin: redis.Redis) -> list[Any]:
    """Entries of ACL LOG (denied commands and keys), less redis-py's connect-time
    CLIENT SETINFO (Redis 7.2+), which the client ignores when denied."""
    entries = admin.acl_log()
    return [entry for entry in entries if entry.get("object") != "client|setinfo"]


@pytest.mark.parametrize("scripting", MODES)
def test_acl_user_with_the_minimal_rights_runs_every_path(
    admin: redis.Redis, scripting: bool
) -> None:
    """As a user granted exactly the documented ACL, acquire/extend/release/wait all work
    and the server denies nothing."""
    url = set_user(admin, "locker", ACL_COMMANDS, ACL_KEYS)
    lock_scenario(url, admin, scripting)
    assert acl_denials(admin) == []


@pytest.mark.parametrize(
    ("scripting", "command"),
    [pytest.param(True, c, id=f"scripting-{c}") for c in SCRIPTING_COMMANDS]
    + [pytest.param(False, c, id=f"plain-{c}") for c in PLAIN_COMMANDS],
)
def test_acl_every_granted_command_is_needed(
    admin: redis.Redis, scripting: bool, command: str
) -> None:
    """Without any one command of its mode's list, the scenario fails and ACL LOG shows it."""
    url = set_user(admin, "locker", tuple(c for c in ACL_COMMANDS if c != command), ACL_KEYS)
    with pytest.raises((LockError, redis.RedisError)):
        lock_scenario(url, admin, scripting)
    assert acl_denials(admin)


@pytest.mark.parametrize("scripting", MODES)
def test_acl_user_without_key_rights_gets_lock_backend_error(
    admin: redis.Redis, scripting: bool
) -> None:
    """A user whose key patterns do not cover the lock gets LockBackendError (NOPERM),
    from a blocking acquire too, never a False that reads as "held by someone"."""
    url = set_user(admin, "outsider", ACL_COMMANDS, ("~other:*",))
    client = client_from_url(url)
    try:
        lock = RedisLock(client, "csl:report", timeout=5, scripting=scripting)
        for call in (lambda: lock.acquire(blocking=False), lambda: lock.acquire(timeout=1)):
            with pytest.raises(LockBackendError, match=r"no permissions|can't run"):
                call()
    finally:
        client.close()
    assert admin.get("csl:report") is None


def test_acl_user_without_evalsha_gets_lock_backend_error(admin: redis.Redis) -> None:
    """A user who may not run scripts gets a LockBackendError naming EVALSHA in scripting
    mode, while scripting=False works for the same user."""
    url = set_user(admin, "noscript", (*PLAIN_COMMANDS, "ping"), ACL_KEYS)
    client = client_from_url(url)
    try:
        with pytest.raises(LockBackendError, match="evalsha"):
            RedisLock(client, "csl:noscript", timeout=5).acquire(blocking=False)
        plain = RedisLock(client, "csl:noscript", timeout=5, scripting=False)
        assert plain.acquire(blocking=False)
        plain.release()
    finally:
        client.close()


# -- TLS ----------------------------------------------------------------------------------


@pytest.mark.parametrize("scripting", MODES)
def test_tls_lock_and_handoff(tls_server: TlsRedisServer, scripting: bool) -> None:
    """Over rediss:// with the server certificate verified, the lock and hand-off work."""
    client = client_from_url(tls_server.url)
    try:
        assert client.connection_pool.connection_class is redis.SSLConnection
        name = f"csl:{uuid.uuid4().hex[:8]}"
        exercise_basics(lambda: RedisLock(client, name, timeout=10, scripting=scripting))
        assert_notified_handoff(
            lambda: RedisLock(client, name, timeout=120, scripting=scripting, fallback_poll=60),
            client,
        )
    finally:
        client.close()


def test_tls_unverifiable_certificate_is_a_backend_error(tls_server: TlsRedisServer) -> None:
    """Without the CA the certificate check fails loudly (LockBackendError), not False."""
    url = f"rediss://127.0.0.1:{tls_server.port}/0?ssl_cert_reqs=required"
    client = client_from_url(url)
    try:
        with pytest.raises(LockBackendError, match="CERTIFICATE_VERIFY_FAILED"):
            RedisLock(client, "csl:tls", timeout=5).acquire(blocking=False)
    finally:
        client.close()


# -- Sentinel ----------------------------------------------------------------------------


@pytest.mark.parametrize("scripting", MODES)
def test_sentinel_url_locks_on_the_master(sentinel: SentinelGroup, scripting: bool) -> None:
    """sentinel://…?master_name=mymaster (three Sentinels) resolves the master, where the
    lock key lives, and acquire/release/hand-off work through it."""
    url = sentinel.url
    client = client_from_url(url)
    master = redis.Redis(port=sentinel.master_port())
    try:
        name = f"csl:{uuid.uuid4().hex[:8]}"
        lock = RedisLock(client, name, timeout=10, scripting=scripting)
        assert lock.acquire(blocking=False)
        assert lock.token.encode() in master.get(name)
        lock.release()
        assert master.get(name) is None
        exercise_basics(lambda: RedisLock(client, name, timeout=10, scripting=scripting))
        assert_notified_handoff(
            lambda: RedisLock(client, name, timeout=120, scripting=scripting, fallback_poll=60),
            master,
        )
    finally:
        client.close()
        master.close()


def test_celery_side_reaches_a_cluster_through_its_url(
    cluster: Cluster, cluster_client: RedisCluster
) -> None:
    """singleton_lock_url = redis+cluster://… gives LockedTask a RedisCluster client: an
    eager locked task holds its lock on the cluster and releases it, and `locks list`'s
    reader lists a held lock from the cluster."""
    from celery import Celery  # noqa: PLC0415 - only this test needs Celery

    from celery_singleton_lock import LockedTask, current_lock  # noqa: PLC0415
    from celery_singleton_lock.ops.cli import read_locks  # noqa: PLC0415

    app = Celery("clustered", broker="memory://", set_as_current=False)
    app.conf.update(
        task_always_eager=True, singleton_lock_url=f"redis+cluster://127.0.0.1:{cluster.ports[0]}/0"
    )

    @app.task(base=LockedTask, name="clustered.job")
    def job(x: int) -> list[str]:
        held = current_lock()
        assert held is not None
        assert isinstance(held.client, RedisCluster)
        assert held.owned()
        return [row.key for row in read_locks(held.client, "csl:*")]

    listed = job.delay(1).get()
    assert len(listed) == 1
    assert listed[0].startswith("csl:clustered.job:{")
    assert not any(k.startswith(b"csl:") for k in cluster_client.keys("csl:*"))
