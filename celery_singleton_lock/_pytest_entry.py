"""The ``pytest11`` entry point of the package: inert unless a suite opts in.

pytest loads every installed ``pytest11`` plugin, so this module only declares the ini
option ``singleton_lock_fixtures`` (default false); when a suite sets it to true, the
fixtures of :mod:`celery_singleton_lock.pytest_plugin` are loaded. ``-p
celery_singleton_lock.pytest_plugin`` and ``pytest_plugins`` load them without it.
"""

from __future__ import annotations

import pytest

PLUGIN = "celery_singleton_lock.pytest_plugin"
INI_NAME = "singleton_lock_fixtures"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        INI_NAME,
        "load celery_singleton_lock's pytest fixtures (singleton_lock_app, singleton_locks, ...)",
        type="bool",
        default=False,
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getini(INI_NAME) and not config.pluginmanager.has_plugin(PLUGIN):
        config.pluginmanager.import_plugin(PLUGIN)
