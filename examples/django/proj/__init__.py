"""A Django project package, as ``django-admin startproject proj`` lays it out.

Importing the Celery app here makes ``@shared_task`` bind to it when Django starts.
"""

from examples.django.proj.celery import app as celery_app

__all__ = ["celery_app"]
