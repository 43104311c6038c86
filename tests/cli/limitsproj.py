"""The Celery project the ``celery locks limit`` tests run the real CLI against
(``celery -A tests.cli.limitsproj``): report exports limited per tenant and in all, an
audit that shares the global budget, and tasks without limits that the command leaves out.

Configured from the environment as ``cliproj`` is: ``CSL_CLI_URL`` is the broker and the
lock Redis, ``CSL_CLI_PREFIX`` the lock prefix (each test uses its own on the shared
server). A test builds the same app in its own process with :func:`make_app`, to take holds
the way the tasks' runs take them. No worker runs: the bodies never run.
"""

from __future__ import annotations

import os

from celery import Celery

from celery_singleton_lock import LockedTask

URL = os.environ.get("CSL_CLI_URL", "redis://127.0.0.1:6399/0")
PREFIX = os.environ.get("CSL_CLI_PREFIX", "csl")

#: The numbers the code gives the limits.
PER_TENANT = 2
IN_ALL = 5
#: The weight of a heavy export.
HEAVY = 2


def export_weight(report: str, tenant: str, heavy: bool = False) -> int:
    """A heavy export takes two of each limit, any other one."""
    return HEAVY if heavy else 1


def make_app(url: str, prefix: str) -> Celery:
    """The project's app for ``url`` and ``prefix``, with its tasks."""
    app = Celery("limitsproj", broker=url, set_as_current=False)
    app.conf.update(singleton_lock_url=url, singleton_lock_prefix=prefix)

    @app.task(
        shared=False,
        name="reports.export",
        base=LockedTask,
        lock_keys=["report"],
        lock_limits=[("tenant:{tenant}", PER_TENANT), ("global:exports", IN_ALL)],
        lock_weight=export_weight,
    )
    def export(report: str, tenant: str, heavy: bool = False) -> None:
        """One export of ``report`` for ``tenant`` at a time, two per tenant, five in all."""

    @app.task(
        shared=False,
        name="reports.audit",
        base=LockedTask,
        lock_keys=["tenant"],
        lock_limits=[("global:exports", IN_ALL)],
    )
    def audit(tenant: str) -> None:
        """An audit takes a share of the global export budget too."""

    @app.task(shared=False, name="reports.ping", base=LockedTask, lock_keys=())
    def ping() -> None:
        """A locked task without limits: no row of ``locks limit list``."""

    @app.task(shared=False, name="reports.plain")
    def plain() -> None:
        """A task that is not locked."""

    return app


app = make_app(URL, PREFIX)
