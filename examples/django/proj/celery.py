"""The project's Celery app, configured from Django's settings (Celery's usual recipe).

``namespace="CELERY"`` means every Celery setting is read from a ``CELERY_``-prefixed name
in ``settings.py``, so this plugin's settings are written ``CELERY_SINGLETON_LOCK_URL``,
``CELERY_SINGLETON_LOCK_TIMEOUT``, … there. In your project, replace
``examples.django.proj`` with your project package (``proj``) and run
``celery -A proj worker -l INFO``.
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.django.proj.settings")

app = Celery("proj")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()  # finds <app>/tasks.py in INSTALLED_APPS
