"""docker-compose.yml and the Dockerfile, checked without a Docker engine."""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml  # type: ignore[import-untyped,unused-ignore]  # no stubs in the test extra

from tests.examples.conftest import ROOT


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    """The services of docker-compose.yml."""
    data = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    found: dict[str, Any] = data["services"]
    return found


def module_file(module: str) -> Path | None:
    """The file a dotted module name resolves to from the repo root, or None."""
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def modules_named(command: list[str]) -> list[str]:
    """Modules a command refers to: ``-A``/``--app`` targets and ``python -m`` modules."""
    found = []
    for flag, value in itertools.pairwise(command):
        if flag in ("-A", "--app", "-m"):
            found.append(value.split(":")[0])
    return found


def test_expected_services_exist(services: dict[str, Any]) -> None:
    """redis, worker, beat and demo are all there."""
    assert {"redis", "worker", "beat", "demo"} <= set(services)


def test_every_command_refers_to_modules_in_the_repo(services: dict[str, Any]) -> None:
    """Every ``-A module`` / ``-m module`` in a command resolves to a file of this repo."""
    checked = 0
    for name, service in services.items():
        if name == "redis":
            continue
        command = service["command"]
        assert isinstance(command, list), f"{name}: use the exec form"
        modules = modules_named(command)
        assert modules, f"{name}: no module in {command}"
        for module in modules:
            assert module_file(module) is not None, f"{name}: {module} is not in the repo"
            checked += 1
    assert checked >= 4


def test_services_run_what_the_examples_document(services: dict[str, Any]) -> None:
    """worker runs the flash-sale tasks, beat the beat-dedup app, demo the producer."""
    assert services["worker"]["command"][:4] == [
        "celery",
        "-A",
        "examples.flash_sale.tasks",
        "worker",
    ]
    assert services["beat"]["command"][:2] == ["celery", "-A"]
    assert services["beat"]["command"][2].startswith("examples.beat_dedup.")
    assert services["beat"]["command"][3] == "beat"
    assert modules_named(services["demo"]["command"]) == ["examples.flash_sale.producer"]


def test_redis_never_evicts_and_reports_health(services: dict[str, Any]) -> None:
    """redis runs with ``--maxmemory-policy noeviction`` and a redis-cli ping healthcheck."""
    redis = services["redis"]
    assert redis["image"].startswith("redis:7")
    command = redis["command"]
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"
    assert "redis-cli" in redis["healthcheck"]["test"]
    assert "ping" in redis["healthcheck"]["test"]


def test_app_services_wait_for_a_healthy_redis_they_reach_by_name(
    services: dict[str, Any],
) -> None:
    """worker, beat and demo depend on redis being healthy and get REDIS_URL pointing at
    the redis service; the worker has no fixed name or port, so it scales."""
    for name, service in services.items():
        if name == "redis":
            continue
        assert service["depends_on"]["redis"]["condition"] == "service_healthy", name
        url = urlsplit(service["environment"]["REDIS_URL"])
        assert (url.scheme, url.hostname) == ("redis", "redis"), name
    worker = services["worker"]
    assert "container_name" not in worker
    assert "ports" not in worker


def test_dockerfile_installs_the_demo_extra_on_python_311_slim() -> None:
    """The image builds from python:3.11-slim, installs ``.[demo]`` and copies examples/,
    and every service builds from it."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim\b", dockerfile, re.M)
    assert re.search(r"pip install [\"']?\.\[demo\]", dockerfile)
    assert re.search(r"^COPY examples\b", dockerfile, re.M)
    for path in re.findall(r"^COPY (\S+)", dockerfile, re.M):
        assert (ROOT / path).exists(), path
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    for name, service in services.items():
        if name != "redis":
            assert service["build"] == ".", name
