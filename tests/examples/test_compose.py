"""docker-compose.yml, run without Docker: each service's own command and environment, as a
local process pointed at private redis-servers instead of the compose hostnames.

No Docker engine runs here, so the translation is what a container would do: the image's
WORKDIR (the repo root) as working directory and on PYTHONPATH, ``celery`` and ``python`` as
this interpreter, every URL naming a compose service rewritten to that service's private
server on loopback, and a path under ``/tmp`` moved into the test's own directory.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
import yaml  # type: ignore[import-untyped,unused-ignore]  # no stubs in the test extra

from celery_singleton_lock.testing import CeleryProcess, RedisServer
from tests.examples.conftest import ROOT

Services = dict[str, dict[str, Any]]


@pytest.fixture(scope="module")
def services() -> Services:
    """The services of docker-compose.yml (``<<`` merges resolved)."""
    data = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    found: Services = data["services"]
    return found


# -- reading the compose file ------------------------------------------------------------


def is_redis(service: dict[str, Any]) -> bool:
    """A service that is a Redis server (an official image, not built here)."""
    return "build" not in service and str(service.get("image", "")).startswith("redis")


def celery_role(service: dict[str, Any]) -> str | None:
    """``worker`` or ``beat`` for a ``celery ... worker|beat`` command, else None."""
    command = service.get("command") or []
    if command[:1] != ["celery"]:
        return None
    return next((arg for arg in command if arg in ("worker", "beat")), None)


def app_of(service: dict[str, Any]) -> str | None:
    """The ``-A`` / ``--app`` module of a celery command."""
    for flag, value in itertools.pairwise(service.get("command") or []):
        if flag in ("-A", "--app"):
            return str(value)
    return None


def modules_named(command: list[str]) -> list[str]:
    """Modules a command refers to: ``-A``/``--app`` targets and ``python -m`` modules."""
    return [
        value.split(":")[0] for flag, value in itertools.pairwise(command) if flag in ("-A", "-m")
    ]


def referenced_services(service: dict[str, Any], names: set[str]) -> dict[str, set[int]]:
    """Compose services this service's environment reaches by hostname, with the ports."""
    found: dict[str, set[int]] = {}
    for value in (service.get("environment") or {}).values():
        url = urlsplit(str(value))
        if url.hostname in names:
            found.setdefault(url.hostname, set()).add(url.port or 6379)
    return found


def listening_port(service: dict[str, Any]) -> int:
    """The port a Redis service listens on: its ``--port`` argument, else 6379."""
    command = [str(arg) for arg in service.get("command") or []]
    return int(command[command.index("--port") + 1]) if "--port" in command else 6379


# -- running a service locally -------------------------------------------------------------


def local_env(service: dict[str, Any], servers: dict[str, RedisServer]) -> dict[str, str]:
    """The service's environment with every ``scheme://<service>:port`` URL pointed at that
    service's private server, and the repo (the image's WORKDIR) on PYTHONPATH."""
    env = {}
    for key, value in (service.get("environment") or {}).items():
        text = str(value)
        parts = urlsplit(text)
        if parts.hostname in servers:
            server = servers[parts.hostname]
            text = parts._replace(netloc=f"127.0.0.1:{server.port}").geturl()
        env[key] = text
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return env


def local_args(command: list[str], tmp: Path) -> list[str]:
    """The command's arguments with each ``/tmp/...`` path moved under ``tmp``."""
    return [str(tmp / Path(arg).name) if arg.startswith("/tmp/") else arg for arg in command]


def start_celery(
    name: str, service: dict[str, Any], servers: dict[str, RedisServer], tmp: Path
) -> CeleryProcess:
    """Start a celery service's command as a local process group; return it once ready."""
    role = celery_role(service)
    process = CeleryProcess(
        local_args(service["command"][1:], tmp), env=local_env(service, servers), cwd=ROOT,
        ready_marker=" ready." if role == "worker" else "beat: Starting", ready_timeout=60,
        name=name,
    )  # fmt: skip
    return process.start(wait=False)


@contextlib.contextmanager
def compose_up(
    names: list[str], services: Services, tmp: Path
) -> Iterator[tuple[dict[str, RedisServer], dict[str, CeleryProcess]]]:
    """Start a private server per Redis service, then the celery services ``names`` (all
    ready); stop every process on exit."""
    with contextlib.ExitStack() as stack:
        servers = {
            name: stack.enter_context(RedisServer())
            for name, service in services.items()
            if is_redis(service)
        }
        started: dict[str, CeleryProcess] = {}
        for name in names:
            started[name] = start_celery(name, services[name], servers, tmp)
            stack.callback(started[name].close)
        for process in started.values():
            process.wait_ready()
        yield servers, started


def run_python(
    service: dict[str, Any], servers: dict[str, RedisServer], tmp: Path, timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run a ``python ...`` service to completion as a local process (bounded)."""
    command = service["command"]
    assert command[0] == "python", command
    return subprocess.run(
        [sys.executable, *local_args(command[1:], tmp)], cwd=ROOT,
        env={**os.environ, **local_env(service, servers)}, capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip


# -- the file's structure ------------------------------------------------------------------


def test_every_service_has_an_image_that_exists(services: Services) -> None:
    """Each service is an official Redis image or is built from a context of this repo whose
    Dockerfile copies only paths that exist, and those include every module its command runs."""
    for name, service in services.items():
        if is_redis(service):
            continue
        assert "build" in service, f"{name}: neither a Redis image nor built here"
        context = ROOT / service["build"]
        dockerfile = context / "Dockerfile"
        assert dockerfile.is_file(), f"{name}: no Dockerfile in {context}"
        copied = re.findall(r"^COPY\s+(.+?)\s+\S+\s*$", dockerfile.read_text(), re.M)
        sources = [Path(src) for line in copied for src in line.split()]
        for source in sources:
            assert (context / source).exists(), f"Dockerfile copies missing {source}"
        for module in modules_named(service["command"]):
            path = Path(*module.split("."))
            assert any(path.is_relative_to(src) for src in sources), f"{name}: {module} not copied"
            assert (context / path).with_suffix(".py").is_file() or (
                context / path / "__init__.py"
            ).is_file(), f"{name}: {module} is not in the repo"


def test_services_wait_for_the_redis_they_use(services: Services) -> None:
    """A service whose environment names another service depends on it being healthy, on
    the port it listens on; that service has a healthcheck; every ``depends_on`` names a
    service of the file."""
    names = set(services)
    checked = 0
    for name, service in services.items():
        depends = service.get("depends_on") or {}
        assert set(depends) <= names, f"{name}: depends on unknown {set(depends) - names}"
        for target, ports in referenced_services(service, names).items():
            assert target in depends, f"{name} uses {target} without depends_on"
            assert ports == {listening_port(services[target])}, f"{name}: {target} ports {ports}"
            assert depends[target]["condition"] == "service_healthy", name
            assert services[target].get("healthcheck"), f"{target} has no healthcheck"
            checked += 1
    assert checked >= 1


def test_every_app_service_is_run_below(services: Services) -> None:
    """Each service other than Redis is a celery worker or beat, or the demo: the tests
    below run all of them (a service added later must be run by a test too)."""
    for name, service in services.items():
        if not is_redis(service):
            assert celery_role(service) or name == "demo", f"{name}: not run by any test"


# -- the services at work ----------------------------------------------------------------


pytestmark = pytest.mark.slow

LOCKED_LINE = re.compile(
    r"^\S+\.buy: sold (\d+) of (\d+) in stock, oversold (\d+), stock left \d+, failed (\d+)", re.M
)


def test_demo_sells_exactly_the_stock_on_the_worker_service(
    services: Services, tmp_path: Path
) -> None:
    """The worker services the demo depends on become ready; the demo's own command then
    exits 0 and reports the locked phase sold the whole stock with nothing oversold."""
    demo = services["demo"]
    workers = [n for n in demo["depends_on"] if celery_role(services[n]) == "worker"]
    assert workers
    with compose_up(workers, services, tmp_path) as (servers, started):
        done = run_python(demo, servers, tmp_path, timeout=240)
        logs = {name: process.tail() for name, process in started.items()}
    assert done.returncode == 0, done.stdout + done.stderr + str(logs)
    locked = LOCKED_LINE.search(done.stdout)
    assert locked is not None, done.stdout
    sold, stock, oversold, failed = map(int, locked.groups())
    assert (sold, oversold, failed) == (stock, 0, 0), done.stdout


def test_beat_and_its_worker_services_run_the_job_one_at_a_time(
    services: Services, tmp_path: Path
) -> None:
    """Each beat service with the worker services of its app: ticks reach the worker, the
    locked job runs, its runs never overlap, and beat sent more ticks than ran."""
    beats = [name for name, service in services.items() if celery_role(service) == "beat"]
    assert beats
    for beat in beats:
        app = app_of(services[beat])
        workers = [
            name
            for name, service in services.items()
            if celery_role(service) == "worker" and app_of(service) == app
        ]
        assert workers, f"no worker service runs {app}"
        with compose_up([*workers, beat], services, tmp_path) as (servers, started):
            (server,) = servers.values()
            client = redis.Redis.from_url(server.url, decode_responses=True)
            deadline = time.monotonic() + 40
            runs: dict[str, list[str]] = {}
            while time.monotonic() < deadline:
                runs = {
                    key: [entry.split()[0] for entry in client.lrange(key, 0, -1)]
                    for key in client.scan_iter(match="*:runs:*")
                }
                if runs and all(kinds.count("end") >= 2 for kinds in runs.values()):
                    break
                time.sleep(0.2)
            ticks = started[beat].log().count("Sending due task")
            client.close()
        assert runs, started[beat].tail()
        for key, kinds in runs.items():
            ended = kinds.count("end")
            assert ended >= 2, (key, kinds, started[beat].tail())
            assert kinds[: 2 * ended] == ["start", "end"] * ended, (key, kinds)  # no overlap
            assert ticks > kinds.count("start"), (ticks, key, kinds)  # ticks were dropped
