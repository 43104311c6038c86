"""docker-compose.yml, run without Docker: each service's own command and environment, as a
local process pointed at private redis-servers instead of the compose hostnames.

No Docker engine runs here, so the translation is what a container would do: the image's
WORKDIR (the repo root) as working directory and on PYTHONPATH, ``celery`` and ``python`` as
this interpreter, every URL naming a compose service rewritten to that service's private
server on loopback, a path under ``/tmp`` (in an argument or the environment) moved into the
test's own directory, and a port a service serves on (``*_METRICS_PORT``) moved to a free one.

The monitoring services (official Prometheus and Grafana images) cannot run here: their
files are checked against each other instead (what Prometheus scrapes is what the worker
services serve, Grafana's datasource is the prometheus service, its dashboards are mounted),
and Prometheus's job is done by hand: the worker services it scrapes run, take orders, and
their ``/metrics`` is scraped at the targets ``examples/prometheus/prometheus.yml`` names.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
import yaml  # type: ignore[import-untyped,unused-ignore]  # no stubs in the test extra
from prometheus_client.parser import text_string_to_metric_families

from celery_singleton_lock.testing import CeleryProcess, RedisServer, free_port
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


#: The official images of the monitoring services, by role.
MONITORING_IMAGES = {"prometheus": "prom/prometheus:", "grafana": "grafana/grafana:"}


def monitoring_role(service: dict[str, Any]) -> str | None:
    """``prometheus`` or ``grafana`` for a service of that official image, else None."""
    image = str(service.get("image", ""))
    if "build" in service:
        return None
    return next(
        (role for role, prefix in MONITORING_IMAGES.items() if image.startswith(prefix)), None
    )


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


def local_env(
    service: dict[str, Any], servers: dict[str, RedisServer], tmp: Path | None = None
) -> dict[str, str]:
    """The service's environment with every ``scheme://<service>:port`` URL pointed at that
    service's private server, a ``/tmp/...`` path moved under ``tmp``, a ``*_METRICS_PORT``
    moved to a free port (so that parallel tests never share one), and the repo (the
    image's WORKDIR) on PYTHONPATH."""
    env = {}
    for key, value in (service.get("environment") or {}).items():
        text = str(value)
        parts = urlsplit(text)
        if parts.hostname in servers:
            server = servers[parts.hostname]
            text = parts._replace(netloc=f"127.0.0.1:{server.port}").geturl()
        elif tmp is not None and text.startswith("/tmp/"):
            text = str(tmp / Path(text).name)
        elif key.endswith("_METRICS_PORT"):
            text = str(free_port())
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
        local_args(service["command"][1:], tmp), env=local_env(service, servers, tmp), cwd=ROOT,
        ready_marker=" ready." if role == "worker" else "beat: Starting", ready_timeout=120,
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
        env={**os.environ, **local_env(service, servers, tmp)}, capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip


# -- the file's structure ------------------------------------------------------------------


def test_every_service_has_an_image_that_exists(services: Services) -> None:
    """Each service is an official Redis image or is built from a context of this repo whose
    Dockerfile copies only paths that exist, and those include every module its command runs."""
    for name, service in services.items():
        if is_redis(service) or monitoring_role(service):
            continue  # official images (the monitoring ones: see the tests below)
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
    """Each service other than Redis is a celery worker or beat, the demo, or a monitoring
    service: the tests below run (or, for the monitoring images, check) all of them (a
    service added later must be run by a test too)."""
    for name, service in services.items():
        if not is_redis(service):
            assert celery_role(service) or name == "demo" or monitoring_role(service), (
                f"{name}: not run by any test"
            )


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


LEADER_SCHEDULER = "celery_singleton_lock.beat:LeaderScheduler"
SENT = re.compile(r"Sending due task (\S+) \(.*?\), slot (\S+)")


def test_beat_replica_services_send_each_slot_once(services: Services, tmp_path: Path) -> None:
    """The beat services that run ``LeaderScheduler``, all started together with their
    app's worker: only one of them sends, every slot it sends is named once, and the job's
    runs still never overlap."""
    replicas = [
        name
        for name, service in services.items()
        if celery_role(service) == "beat" and LEADER_SCHEDULER in service["command"]
    ]
    assert len(replicas) >= 2, replicas
    app = app_of(services[replicas[0]])
    workers = [
        name
        for name, service in services.items()
        if celery_role(service) == "worker" and app_of(service) == app
    ]
    with compose_up([*workers, *replicas], services, tmp_path) as (servers, started):
        (server,) = servers.values()
        client = redis.Redis.from_url(server.url, decode_responses=True)
        deadline = time.monotonic() + 60
        sent: list[tuple[str, str]] = []
        while time.monotonic() < deadline:
            sent = [pair for name in replicas for pair in SENT.findall(started[name].log())]
            if len(sent) >= 4:
                break
            time.sleep(0.2)
        runs = {
            key: [entry.split()[0] for entry in client.lrange(key, 0, -1)]
            for key in client.scan_iter(match="*:runs:*")
        }
        senders = [name for name in replicas if SENT.search(started[name].log())]
        client.close()
    assert len(sent) >= 4, sent
    assert len(sent) == len(set(sent)), sent
    assert len(senders) == 1, senders
    for key, kinds in runs.items():
        starts = kinds.count("start")
        assert kinds[: 2 * starts - 1] == (["start", "end"] * starts)[: 2 * starts - 1], key


# -- the monitoring services ------------------------------------------------------------------


def mounts(service: dict[str, Any]) -> dict[str, Path]:
    """The service's bind mounts of this repo: container path -> the repo path mounted."""
    found = {}
    for volume in service.get("volumes") or []:
        source, target, *_ = str(volume).split(":")
        assert source.startswith("./"), f"{volume}: not a path of the repo"
        found[target] = ROOT / source
    return found


def in_container(service: dict[str, Any], path: str) -> Path | None:
    """The repo file that ``path`` is inside the service's container, if it is mounted."""
    for target, source in mounts(service).items():
        if path == target or path.startswith(target.rstrip("/") + "/"):
            return source / path[len(target) :].lstrip("/")
    return None


def flag(command: list[str], name: str) -> str | None:
    """The value of ``--name=value`` in ``command``."""
    return next((arg.split("=", 1)[1] for arg in command if arg.startswith(f"--{name}=")), None)


def one_service(services: Services, role: str) -> tuple[str, dict[str, Any]]:
    (found,) = [(n, s) for n, s in services.items() if monitoring_role(s) == role]
    return found


def scrape_targets(services: Services) -> list[tuple[str, int]]:
    """``(compose service, port)`` of every target the prometheus service's config scrapes
    (static targets, and DNS service discovery of compose service names)."""
    _, prometheus = one_service(services, "prometheus")
    config_path = in_container(prometheus, flag(prometheus["command"], "config.file") or "")
    assert config_path is not None, "prometheus's config file is not mounted"
    assert config_path.is_file(), f"{config_path} is missing"
    config = yaml.safe_load(config_path.read_text())
    targets = []
    for job in config["scrape_configs"]:
        for static in job.get("static_configs") or []:
            for target in static["targets"]:
                host, port = target.rsplit(":", 1)
                targets.append((host, int(port)))
        for dns in job.get("dns_sd_configs") or []:
            assert dns.get("type", "SRV") == "A", "only A records name compose services"
            targets += [(name, int(dns["port"])) for name in dns["names"]]
    return targets


def test_monitoring_services_are_wired_to_each_other(services: Services) -> None:
    """Prometheus and Grafana run pinned official images with files of this repo mounted;
    Prometheus scrapes worker services on the port each serves its metrics on; Grafana's
    datasource is the prometheus service on the port it listens on, it waits for it to be
    healthy, and its provisioned dashboards (and the home dashboard) are mounted."""
    names = set(services)
    for name, service in services.items():
        if monitoring_role(service):
            tag = str(service["image"]).rsplit(":", 1)[1]
            assert tag not in ("", "latest"), f"{name}: pin the image's version"
            for target, source in mounts(service).items():
                assert source.exists(), f"{name}: mounts missing {source} at {target}"
    prometheus_name, prometheus = one_service(services, "prometheus")
    targets = scrape_targets(services)
    assert targets
    for host, port in targets:
        assert host in names, f"prometheus scrapes {host}, not a service"
        worker = services[host]
        assert celery_role(worker) == "worker", f"prometheus scrapes {host}, not a worker"
        served = {
            int(value)
            for key, value in (worker.get("environment") or {}).items()
            if key.endswith("_METRICS_PORT")
        }
        assert served == {port}, f"{host} serves its metrics on {served}, scraped on {port}"
        assert worker["environment"].get("PROMETHEUS_MULTIPROC_DIR"), f"{host}: prefork, no dir"
        assert host in (prometheus.get("depends_on") or {}), f"prometheus does not start {host}"
    listen = flag(prometheus["command"], "web.listen-address") or ":9090"
    prometheus_port = int(listen.rsplit(":", 1)[1])
    assert prometheus.get("healthcheck"), "prometheus has no healthcheck"

    grafana_name, grafana = one_service(services, "grafana")
    depends = grafana.get("depends_on") or {}
    assert depends[prometheus_name]["condition"] == "service_healthy", grafana_name
    provisioning = in_container(grafana, "/etc/grafana/provisioning")
    assert provisioning is not None, "no provisioning mounted"
    assert provisioning.is_dir(), f"{provisioning} is missing"
    sources = [
        source
        for path in sorted((provisioning / "datasources").glob("*.yml"))
        for source in yaml.safe_load(path.read_text())["datasources"]
    ]
    (datasource,) = [source for source in sources if source["type"] == "prometheus"]
    url = urlsplit(datasource["url"])
    assert (url.hostname, url.port) == (prometheus_name, prometheus_port), datasource
    dashboards = [
        in_container(grafana, provider["options"]["path"])
        for path in sorted((provisioning / "dashboards").glob("*.yml"))
        for provider in yaml.safe_load(path.read_text())["providers"]
    ]
    assert dashboards, "no dashboard provider"
    for folder in dashboards:
        assert folder is not None, "a dashboard provider's path is not mounted"
        assert list(folder.glob("*.json")), f"no dashboard in {folder}"
    home = grafana["environment"].get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
    if home:
        found = in_container(grafana, home)
        assert found is not None, f"the home dashboard {home} is not mounted"
        assert found.is_file(), f"the home dashboard {found} is missing"


def test_prometheus_targets_serve_the_lock_metrics(services: Services, tmp_path: Path) -> None:
    """Prometheus's job, by hand: the worker services it scrapes run as compose runs them
    (metrics port and multiprocess directory from their environment), orders go through the
    locked checkout, and each target's ``/metrics`` counts every run of every pool process:
    one acquisition, one wait and one hold per order."""
    orders = 24
    workers = sorted({host for host, _ in scrape_targets(services)})
    with compose_up(workers, services, tmp_path) as (servers, started):
        producer = {
            **services["demo"],
            "command": [
                "python", "-m", "examples.flash_sale.producer",
                "--orders", str(orders), "--stock", "5", "--skus", "2",
            ],
        }  # fmt: skip
        done = run_python(producer, servers, tmp_path, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        texts = {}
        for name in workers:
            port = next(
                value for key, value in started[name].env.items() if key.endswith("_METRICS_PORT")
            )
            url = f"http://127.0.0.1:{port}/metrics"
            with urllib.request.urlopen(url, timeout=10) as reply:
                texts[name] = reply.read().decode()
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for text in texts.values():
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                samples[key] = samples.get(key, 0.0) + sample.value
    buy = (("task", "examples.flash_sale.tasks.buy"),)
    prefix = "celery_singleton_lock"
    assert samples.get((f"{prefix}_acquired_total", (("scope", "run"), *buy))) == orders, texts
    assert samples.get((f"{prefix}_wait_seconds_count", buy)) == orders, texts
    assert samples.get((f"{prefix}_held_seconds_count", buy)) == orders, texts
