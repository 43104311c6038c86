"""First contact with real workers: every mistake a new user can make gets a clear error
before a message is consumed, every per-call option is honoured, and no password of the
lock URL is ever printed."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import redis
from celery.exceptions import ImproperlyConfigured

from celery_singleton_lock import RedisLock, TaskLocked
from celery_singleton_lock.engine.value import parse_value
from celery_singleton_lock.testing import RedisServer, free_port
from tests.worker.conftest import ROOT, wait_for

pytestmark = pytest.mark.slow

APP = "tests.worker.contact_proj"
QUEUE = "csl-contact"
SECRET = "s3cr3t-Pa55"
#: sysexits.h EX_CONFIG: what a worker with a bad configuration exits with.
EX_CONFIG = 78


@pytest.fixture(scope="module")
def contact(proj: ModuleType) -> ModuleType:
    """The first-contact project, imported with the worker tests' environment."""
    return importlib.import_module(APP)


def _env(worker_redis: RedisServer, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "CSL_BROKER_URL": worker_redis.url,
        "CSL_BACKEND_URL": worker_redis.url.replace("/0", "/1"),
        "PYTHONPATH": str(ROOT),
        **extra,
    }


def _celery(
    worker_redis: RedisServer, *args: str, timeout: float = 60.0, **extra: str
) -> subprocess.CompletedProcess[str]:
    """Run ``celery -A contact_proj ARGS`` to completion (bounded) and capture its output."""
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", APP, *args],
        cwd=ROOT, env=_env(worker_redis, **extra), capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip


def _refused_start(worker_redis: RedisServer, data: redis.Redis, **extra: str) -> str:
    """Start a worker that must refuse to start; return what it printed. Checks that it
    exited with EX_CONFIG and that a message waiting in its queue was not consumed."""
    data.delete(QUEUE)
    publisher = importlib.import_module(APP)
    publisher.plain.delay("waiting")
    assert data.llen(QUEUE) == 1
    done = _celery(
        worker_redis, "worker", "--pool", "prefork", "--concurrency", "1",
        "--without-gossip", "--without-mingle", "--without-heartbeat", **extra,
    )  # fmt: skip
    assert done.returncode == EX_CONFIG, done.stdout + done.stderr
    assert data.llen(QUEUE) == 1, "the worker consumed a message before refusing to start"
    data.delete(QUEUE)
    return done.stdout + done.stderr


@pytest.mark.parametrize(
    ("extra", "named", "suggested"),
    [
        ({"CSL_EXTRA_CONF": json.dumps({"singleton_lock_timout": 5})},
         "singleton_lock_timout", "singleton_lock_timeout"),
        ({"CSL_DJANGO_CONF": json.dumps({"CELERY_SINGLETON_LOCK_ON_CONFLICTS": "wait"})},
         "CELERY_SINGLETON_LOCK_ON_CONFLICTS", "CELERY_SINGLETON_LOCK_ON_CONFLICT"),
        ({"CSL_EXTRA_CONF": json.dumps({"singleton_lock_tasks": {"x.*": {"lock_keyz": ["a"]}}})},
         "lock_keyz", "lock_keys"),
        ({"CSL_TYPO_TASK": "1"}, "lock_timout", "lock_timeout"),
    ],
    ids=["setting", "django-setting", "tasks-entry", "decorator"],
)  # fmt: skip
def test_unknown_names_stop_the_worker_with_a_suggestion(
    worker_redis: RedisServer, data: redis.Redis, extra: dict[str, str], named: str,
    suggested: str,
) -> None:  # fmt: skip
    """A misspelt setting (plain or Django), ``singleton_lock_tasks`` option or decorator
    option stops the worker before it takes a message, naming the typo and the fix."""
    printed = _refused_start(worker_redis, data, **extra)
    assert named in printed
    assert f"did you mean {suggested!r}" in printed or f"did you mean '{suggested}'" in printed


def test_bad_value_stops_the_worker_naming_setting_and_values(
    worker_redis: RedisServer, data: redis.Redis
) -> None:
    """A bad value exits 78 with one line naming the setting and the accepted values."""
    printed = _refused_start(
        worker_redis, data, CSL_EXTRA_CONF=json.dumps({"singleton_lock_on_conflict": "explode"})
    )
    line = next(line for line in printed.splitlines() if "singleton_lock_on_conflict" in line)
    for accepted in ("skip", "wait", "retry", "raise"):
        assert accepted in line
    assert "Traceback" not in printed


def test_bad_port_stops_the_worker_without_the_password(
    worker_redis: RedisServer, data: redis.Redis
) -> None:
    """A lock URL with an impossible port is a configuration error, and the error masks
    the password."""
    printed = _refused_start(
        worker_redis, data, CSL_LOCK_URL=f"redis://user:{SECRET}@127.0.0.1:99999/0"
    )
    assert "singleton_lock_url" in printed
    assert "port" in printed
    assert SECRET not in printed


def test_per_call_unknown_option_is_refused_with_a_suggestion(contact: ModuleType) -> None:
    """A misspelt per-call option raises at the call (nothing is published), through
    ``apply_async`` and through a signature's options alike."""
    with pytest.raises(ImproperlyConfigured, match="did you mean 'lock_timeout'"):
        contact.probe.apply_async(("x",), lock_timout=5)
    with pytest.raises(ImproperlyConfigured, match="did you mean 'lock_on_conflict'"):
        contact.probe.s("x").set(lock_on_conflit="raise").apply_async()


# -- per-call options honoured by a real worker ----------------------------------------


@pytest.fixture
def worker(workers: Any, contact: ModuleType) -> Any:
    return workers(concurrency=2, app=APP)


def _reports(data: redis.Redis, name: str) -> list[dict[str, Any]]:
    return [json.loads(item) for item in data.lrange(f"probe:{name}", 0, -1)]


def test_per_call_lock_timeout(contact: ModuleType, data: redis.Redis, worker: Any) -> None:
    report = contact.probe.apply_async(("t",), lock_timeout=7).get(timeout=20)
    assert report["timeout"] == 7.0
    assert contact.probe.delay("t2").get(timeout=20)["timeout"] == 30.0


def test_per_call_lock_keys(contact: ModuleType, data: redis.Redis, worker: Any) -> None:
    """lock_keys=["name"] per call: the note no longer makes a different key."""
    first = contact.probe.apply_async(("k",), {"note": "a"}, lock_keys=["name"]).get(timeout=20)
    second = contact.probe.apply_async(("k",), {"note": "b"}, lock_keys=["name"]).get(timeout=20)
    assert first["key"] == second["key"]
    plain_a = contact.probe.delay("k", note="a").get(timeout=20)
    plain_b = contact.probe.delay("k", note="b").get(timeout=20)
    assert plain_a["key"] != plain_b["key"]
    assert plain_a["key"] == contact.probe.lock_key("k", note="a")


def _server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()  # type: ignore[misc]
    return int(seconds) * 1000 + int(micros) // 1000


def test_per_call_lock_renew(contact: ModuleType, data: redis.Redis, worker: Any) -> None:
    """lock_renew=False with a 1 s lease: the key lapses while the 3 s body still runs;
    renewed, it is still held once its first lease has ended. Both judged once the first
    lease's end (read from the value) has passed on the server's clock, not after 1.6 s."""
    client = redis.Redis.from_url(worker_redis_url(data))

    def past_first_lease(key: str) -> None:
        raw = client.get(key)
        assert raw is not None
        ends = parse_value(raw).expiry_ms
        assert ends is not None
        assert wait_for(lambda: _server_ms(client) > ends, timeout=30)

    key = contact.probe.lock_key("r", 3.0)
    result = contact.probe.apply_async(("r", 3.0), lock_renew=False, lock_timeout=1)
    assert wait_for(lambda: data.llen("probe:r") == 1, timeout=20)
    past_first_lease(key)
    assert not RedisLock(client, key, timeout=1).locked()
    assert result.get(timeout=30)["renew"] is False
    renewed = contact.probe.apply_async(("r2", 3.0), lock_timeout=1)
    assert wait_for(lambda: data.llen("probe:r2") == 1, timeout=20)
    past_first_lease(contact.probe.lock_key("r2", 3.0))
    assert RedisLock(client, contact.probe.lock_key("r2", 3.0), timeout=1).locked()
    renewed.get(timeout=30)


def worker_redis_url(data: redis.Redis) -> str:
    kwargs = data.connection_pool.connection_kwargs
    return f"redis://{kwargs['host']}:{kwargs['port']}/0"


@pytest.fixture
def held(data: redis.Redis) -> Iterator[Any]:
    """Hold a task's lock from the test process: ``held(key)`` returns the RedisLock."""
    client = redis.Redis.from_url(worker_redis_url(data))
    locks: list[RedisLock] = []

    def hold(key: str) -> RedisLock:
        lock = RedisLock(client, key, timeout=30)
        assert lock.acquire(blocking=False)
        locks.append(lock)
        return lock

    yield hold
    for lock in locks:
        if lock.owned():
            lock.release()


def test_per_call_lock_on_conflict(
    contact: ModuleType, data: redis.Redis, worker: Any, held: Any
) -> None:
    held(contact.probe.lock_key("c"))
    assert contact.probe.delay("c").get(timeout=20) is None  # the default: skip
    with pytest.raises(TaskLocked):
        contact.probe.apply_async(("c",), lock_on_conflict="raise").get(timeout=20)
    assert data.llen("probe:c") == 0


def test_per_call_lock_wait(contact: ModuleType, data: redis.Redis, worker: Any, held: Any) -> None:
    """wait with lock_wait=0.5 gives up after about half a second (the default is 60 s)."""
    key = contact.probe.lock_key("w")
    held(key)
    result = contact.probe.apply_async(("w",), lock_on_conflict="wait", lock_wait=0.5)
    with pytest.raises(TaskLocked):
        # after its own 0.5 s: waiting the default 60 s would end this get with a timeout
        result.get(timeout=45)
    assert data.llen("probe:w") == 0
    # a waiting run says so at INFO: what it waits for and for how long at most
    assert f"waiting for lock {key}" in worker.log()
    assert "at most 0.5 s" in worker.log()


def test_per_call_lock_retry_delay(
    contact: ModuleType, data: redis.Redis, worker: Any, held: Any
) -> None:
    """retry with lock_retry_delay=0.2 comes back within seconds of the release (the
    default waits for the holder's 30 s lease)."""
    lock = held(contact.probe.lock_key("d"))
    result = contact.probe.apply_async(("d",), lock_on_conflict="retry", lock_retry_delay=0.2)
    time.sleep(1.0)
    assert data.llen("probe:d") == 0
    lock.release()
    report = result.get(timeout=30)
    assert report["retries"] >= 1


def test_per_call_lock_scope(contact: ModuleType, data: redis.Redis, worker: Any) -> None:
    """lock_scope="queue" per call: a duplicate while the first is queued or running
    publishes nothing and gets the first's result."""
    first = contact.probe.apply_async(("s", 1.5), lock_scope="queue")
    second = contact.probe.apply_async(("s", 1.5), lock_scope="queue")
    assert second.id == first.id
    first.get(timeout=20)
    assert data.llen("probe:s") == 1


def test_per_call_lock_queue_timeout(contact: ModuleType, data: redis.Redis, worker: Any) -> None:
    """lock_queue_timeout per call is the lease of the lock while the message waits."""
    client = redis.Redis.from_url(worker_redis_url(data))
    result = contact.probe.apply_async(
        ("q",), lock_scope="queue", lock_queue_timeout=5, countdown=2
    )
    ttl = client.pttl(contact.probe.lock_key("q"))
    assert 4000 < ttl <= 5000 + 2000  # the lease plus the key's short grace
    result.get(timeout=20)


# -- where the locks go, and no secrets -------------------------------------------------


def test_worker_logs_where_the_locks_go_with_the_password_masked(
    contact: ModuleType, data: redis.Redis, workers: Any, worker_redis: RedisServer
) -> None:
    """The lock Redis, its origin, and nothing secret appear in the worker's log; ``celery
    inspect conf`` and ``celery report`` mask the password too."""
    with RedisServer() as locked_server:
        redis.Redis(host="127.0.0.1", port=locked_server.port).config_set("requirepass", SECRET)
        url = f"redis://:{SECRET}@127.0.0.1:{locked_server.port}/0"
        worker = workers(concurrency=1, app=APP, extra_env={"CSL_LOCK_URL": url})
        log = worker.log()
        assert "singleton locks:" in log
        assert "from singleton_lock_url" in log
        assert f"127.0.0.1:{locked_server.port}" in log
        assert SECRET not in log
        # the password works: a locked task runs
        assert contact.probe.delay("pw").get(timeout=20)["key"]
        conf = _celery(worker_redis, "inspect", "conf", "--timeout", "5", CSL_LOCK_URL=url)
        assert "singleton_lock_url" in conf.stdout, conf.stdout + conf.stderr
        assert SECRET not in conf.stdout + conf.stderr
        report = _celery(worker_redis, "report", CSL_LOCK_URL=url)
        assert report.returncode == 0, report.stderr
        assert "singleton_lock_url" in report.stdout
        assert SECRET not in report.stdout + report.stderr
        assert SECRET not in worker.log()


def test_worker_says_when_the_lock_url_came_from_the_broker(
    contact: ModuleType, data: redis.Redis, workers: Any
) -> None:
    worker = workers(concurrency=1, app=APP)
    assert "from broker_url" in worker.log()


def test_unreachable_lock_redis_is_reported_at_start(
    contact: ModuleType, data: redis.Redis, workers: Any
) -> None:
    dead = f"redis://:{SECRET}@127.0.0.1:{free_port()}/0"
    worker = workers(concurrency=1, app=APP, extra_env={"CSL_LOCK_URL": dead})
    log = worker.log()
    assert "unreachable" in log
    assert "singleton_lock_url" in log
    assert SECRET not in log


def test_cli_errors_mask_the_password(worker_redis: RedisServer) -> None:
    dead = f"redis://:{SECRET}@127.0.0.1:{free_port()}/0"
    done = _celery(worker_redis, "locks", "list", CSL_LOCK_URL=dead)
    assert done.returncode != 0
    assert "127.0.0.1" in done.stdout + done.stderr
    assert SECRET not in done.stdout + done.stderr


def test_memory_broker_without_lock_url_warns(tmp_path: Path) -> None:
    """With a memory:// broker and no lock URL the worker says loudly that locks go to the
    default localhost Redis and which setting to change."""
    module = tmp_path / "memapp.py"
    module.write_text(
        "from celery import Celery\n"
        "from celery_singleton_lock import LockedTask\n"
        "app = Celery('memapp', broker='memory://')\n"
        "@app.task(base=LockedTask)\n"
        "def job() -> None: ...\n"
    )
    log = tmp_path / "worker.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "memapp", "worker", "--pool", "solo",
         "--loglevel", "INFO", "--logfile", str(log), "--without-gossip", "--without-mingle",
         "--without-heartbeat"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": f"{tmp_path}:{ROOT}"},
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        assert wait_for(lambda: log.exists() and " ready." in log.read_text(), timeout=30)
        text = log.read_text()
        assert "no singleton_lock_url is set" in text
        assert "redis://localhost:6379/0" in text
    finally:
        os.killpg(process.pid, 9)
        process.wait(timeout=10)
