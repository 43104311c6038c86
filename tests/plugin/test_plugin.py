"""The pytest plugin in real pytest runs of small suites: inert until a suite opts in; its
fixtures (private redis-server, configured app, lock assertions) with an app of its own and
beside Celery's in-process ``celery_app``/``celery_worker`` with pytest-celery 1.x loaded."""

from __future__ import annotations

import pytest

from tests.plugin.conftest import RunSuite

pytestmark = pytest.mark.slow

INERT = """
def test_only_the_entry_point_is_loaded(request):
    manager = request.config.pluginmanager
    assert manager.has_plugin("celery_singleton_lock")
    assert not manager.has_plugin("celery_singleton_lock.pytest_plugin")

def test_fixtures_are_absent(singleton_locks):
    pass
"""

OWN_APP = """
import pytest
from celery_singleton_lock import LockedTask, RedisLock

def test_app_key_and_assertions(singleton_lock_app, singleton_locks, singleton_lock_url,
                                singleton_lock_prefix):
    app = singleton_lock_app
    app.conf.task_always_eager = True

    @app.task(base=LockedTask, lock_keys=["sku"])
    def buy(sku, n):
        return n

    key = buy.lock_key("sku-1", 1)
    assert key.startswith(singleton_lock_prefix + ":")
    assert app.conf.singleton_lock_url == singleton_lock_url
    assert singleton_lock_url.startswith("redis://127.0.0.1:")
    assert ":6379/" not in singleton_lock_url
    singleton_locks.assert_free(key)
    assert buy.delay("sku-1", 5).get() == 5
    singleton_locks.assert_no_locks()

    holder = RedisLock(singleton_locks.client, key, timeout=30,
                       holder_info={"task_id": "t-1", "task": buy.name})
    assert holder.acquire(blocking=False)
    singleton_locks.assert_held(key, task_id="t-1")
    assert singleton_locks.held() == [key]
    assert singleton_locks.holder(key).task_id == "t-1"
    with pytest.raises(AssertionError, match="still held by task"):
        singleton_locks.assert_free(key, timeout=0.2)
    with pytest.raises(AssertionError, match="locks left"):
        singleton_locks.assert_no_locks(timeout=0.2)
    with pytest.raises(AssertionError, match="expected held by t-2"):
        singleton_locks.assert_held(key, task_id="t-2", timeout=0.2)
    assert buy.delay("sku-1", 6).get() is None  # skipped while held
    holder.release()
    singleton_locks.assert_no_locks()

def test_assertions_wait_for_the_state(singleton_locks):
    import threading

    key = singleton_locks.prefix + ":w:{1}"
    first = RedisLock(singleton_locks.client, key, timeout=30)
    assert first.acquire(blocking=False)
    releaser = threading.Timer(0.3, first.release)
    releaser.start()
    singleton_locks.assert_free(key, timeout=5)
    releaser.join(5)
    second = RedisLock(singleton_locks.client, key, timeout=30)
    taker = threading.Timer(0.3, lambda: second.acquire(blocking=False))
    taker.start()
    singleton_locks.assert_held(key, timeout=5)
    taker.join(5)
    second.release()

def test_leaves_a_lock_behind(singleton_locks):
    lock = RedisLock(singleton_locks.client, singleton_locks.prefix + ":left:{x}", timeout=60,
                     holder_info={"task_id": "left", "task": "left"})
    assert lock.acquire(blocking=False)
    assert singleton_locks.held()

def test_starts_with_no_locks(singleton_locks):
    assert singleton_locks.held() == []
"""

IN_PROCESS_CONFTEST = """
import pytest

pytest_plugins = ("celery.contrib.pytest", "celery_singleton_lock.pytest_plugin")

@pytest.fixture(scope="session")
def celery_config(singleton_lock_config):
    return {"broker_url": "memory://", "result_backend": "cache+memory://",
            **singleton_lock_config}
"""

IN_PROCESS = """
from celery.contrib.testing.worker import TestWorkController
from celery_singleton_lock import LockedTask, RedisLock, skip_info

def test_locked_task_in_celerys_in_process_worker(request, celery_app, celery_worker,
                                                   singleton_locks):
    assert request.config.pluginmanager.has_plugin("celery")  # pytest-celery 1.x
    assert isinstance(celery_worker, TestWorkController)  # in-process, not a container

    @celery_app.task(base=LockedTask, lock_keys=["n"])
    def double(n):
        return 2 * n

    celery_worker.reload()
    key = double.lock_key(21)
    assert double.delay(21).get(timeout=30) == 42
    singleton_locks.assert_free(key)

    holder = RedisLock(singleton_locks.client, key, timeout=30)
    assert holder.acquire(blocking=False)
    skipped = double.delay(21)
    assert skipped.get(timeout=30) is None
    assert skip_info(skipped, app=celery_app).key == key
    assert double.delay(22).get(timeout=30) == 44
    holder.release()
    singleton_locks.assert_no_locks()
"""


def test_installed_plugin_is_inert_without_opt_in(run_suite: RunSuite) -> None:
    """With the package installed but no opt-in, pytest loads only the entry point, which
    defines no fixture: a test asking for ``singleton_locks`` errors as unknown."""
    done = run_suite({"test_inert.py": INERT})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "fixture 'singleton_locks' not found" in done.stdout
    assert "1 passed, 1 error" in done.stdout


def test_ini_opt_in_gives_an_app_and_lock_assertions(run_suite: RunSuite) -> None:
    """``singleton_lock_fixtures = true`` loads the fixtures (accepted by --strict-config):
    a private server, an app locking on it, ``task.lock_key``, and assertions that wait for
    the state they assert and report holders; every test starts with no locks."""
    ini = "[pytest]\nsingleton_lock_fixtures = true\naddopts = --strict-config --strict-markers\n"
    done = run_suite({"pytest.ini": ini, "test_own_app.py": OWN_APP})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 passed" in done.stdout


def test_command_line_opt_in(run_suite: RunSuite) -> None:
    """``-p celery_singleton_lock.pytest_plugin`` loads the same fixtures without an ini."""
    done = run_suite({"test_own_app.py": OWN_APP}, "-p", "celery_singleton_lock.pytest_plugin")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 passed" in done.stdout


def test_beside_celerys_in_process_fixtures_and_pytest_celery(run_suite: RunSuite) -> None:
    """With pytest-celery 1.x installed, a conftest loading ``celery.contrib.pytest`` and our
    plugin gets Celery's in-process ``celery_worker`` (no Docker) running a locked task on
    our Redis: it runs, a duplicate of a held key is skipped, and no lock is left."""
    done = run_suite({"conftest.py": IN_PROCESS_CONFTEST, "test_in_process.py": IN_PROCESS})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
