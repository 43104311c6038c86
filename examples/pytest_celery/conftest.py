"""pytest-celery's container setup for locked tasks (needs a Docker engine).

The broker and the result backend are Redis containers (the locks use the broker's Redis,
the default lock URL), and the worker runs in a container built from this repository by
``Dockerfile`` beside this file, with ``tasks.py`` injected. Everything here only declares
fixtures: importing and collecting needs no Docker; running the tests does.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from pytest_celery import (
    CeleryBackendCluster,
    CeleryBrokerCluster,
    CeleryWorkerContainer,
    RedisTestBackend,
    RedisTestBroker,
    defaults,
)
from pytest_docker_tools import build, container, fxtr

from examples.pytest_celery import tasks

ROOT = Path(__file__).resolve().parents[2]


class LockedWorkerContainer(CeleryWorkerContainer):
    """The worker container: its name and queue, and the tasks module it gets."""

    @classmethod
    def worker_name(cls) -> str:
        return "locked_worker"

    @classmethod
    def worker_queue(cls) -> str:
        return "locked"

    @classmethod
    def tasks_modules(cls) -> set[ModuleType]:
        return {tasks}


locked_worker_image = build(
    path=str(ROOT),
    dockerfile="examples/pytest_celery/Dockerfile",
    tag="celery-singleton-lock/pytest-celery-example-worker:latest",
    buildargs=LockedWorkerContainer.buildargs(),
)

locked_worker_container = container(
    image="{locked_worker_image.id}",
    environment=fxtr("default_worker_env"),
    network="{default_pytest_celery_network.name}",
    volumes={"{default_worker_volume.name}": defaults.DEFAULT_WORKER_VOLUME},
    wrapper_class=LockedWorkerContainer,
    timeout=defaults.DEFAULT_WORKER_CONTAINER_TIMEOUT,
    command=LockedWorkerContainer.command(),
)


@pytest.fixture
def default_worker_container_cls() -> type[CeleryWorkerContainer]:
    return LockedWorkerContainer


@pytest.fixture(scope="session")
def default_worker_container_session_cls() -> type[CeleryWorkerContainer]:
    return LockedWorkerContainer


@pytest.fixture
def default_worker_container(
    locked_worker_container: LockedWorkerContainer,
) -> CeleryWorkerContainer:
    """The built-in worker's container, replaced by ours."""
    return locked_worker_container


@pytest.fixture
def celery_broker_cluster(celery_redis_broker: RedisTestBroker) -> Iterator[CeleryBrokerCluster]:
    """Redis only (pytest-celery would also try RabbitMQ): the locks live on it."""
    cluster = CeleryBrokerCluster(celery_redis_broker)
    yield cluster
    cluster.teardown()


@pytest.fixture
def celery_backend_cluster(
    celery_redis_backend: RedisTestBackend,
) -> Iterator[CeleryBackendCluster]:
    """A Redis result backend, so AsyncResult.get() works."""
    cluster = CeleryBackendCluster(celery_redis_backend)
    yield cluster
    cluster.teardown()
