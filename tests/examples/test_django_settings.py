"""The Django example's settings reach the plugin through Celery's ``CELERY`` namespace."""

from __future__ import annotations

import ast
import importlib.util
from types import ModuleType

from celery import Celery

from celery_singleton_lock.config import settings_for
from tests.examples.conftest import ROOT

PROJ = ROOT / "examples" / "django" / "proj"


def load_settings() -> ModuleType:
    """``proj/settings.py`` as a plain module (no Django, no ``proj`` package import)."""
    spec = importlib.util.spec_from_file_location("example_django_settings", PROJ / "settings.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_settings_object_with_celery_namespace_configures_the_plugin() -> None:
    """An app configured like Django's (``namespace="CELERY"``) from the example settings
    gets every ``CELERY_SINGLETON_LOCK_*`` value."""
    settings = load_settings()
    app = Celery("proj", set_as_current=False)
    app.config_from_object(settings, namespace="CELERY")
    found = settings_for(app)
    assert found.url == settings.CELERY_SINGLETON_LOCK_URL
    assert found.prefix == "shop-locks"
    assert found.timeout == 60.0
    assert found.on_conflict == "skip"
    assert found.scope == "run"
    assert found.renew is True
    assert found.fail_open is False
    billing = found.options_for("billing.tasks.charge_card", None)
    assert billing is not None
    assert billing.keys == ("invoice_id",)
    assert billing.on_conflict == "wait"
    assert billing.timeout == 60.0  # the project-wide lease applies
    report = found.options_for("reports.tasks.rebuild_index", None)
    assert report is not None
    assert (report.keys, report.scope) == ((), "queue")
    assert found.options_for("shop.tasks.unrelated", None) is None


def test_celery_module_reads_django_settings_with_the_celery_namespace() -> None:
    """``proj/celery.py`` calls ``config_from_object("django.conf:settings",
    namespace="CELERY")`` (checked on its source: Django is not installed here)."""
    tree = ast.parse((PROJ / "celery.py").read_text())
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "config_from_object"
    ]
    assert len(calls) == 1
    (call,) = calls
    assert [ast.literal_eval(arg) for arg in call.args] == ["django.conf:settings"]
    assert {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords} == {"namespace": "CELERY"}
