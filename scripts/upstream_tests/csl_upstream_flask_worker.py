"""The worker app of celery-once's Flask test: the aliases first, then that test's own app
(``tests.integration.flask_app.app`` of the exported upstream tests, found on the run's
``PYTHONPATH``). Started by ``run.py`` as ``celery -A csl_upstream_flask_worker worker``."""

from __future__ import annotations

import importlib

import csl_upstream_alias  # noqa: F401 - installs the aliases before the app imports celery_once

app = importlib.import_module("tests.integration.flask_app.app").celery

__all__ = ["app"]
