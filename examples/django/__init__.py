"""Django: the settings names a Django project uses (``CELERY_SINGLETON_LOCK_…``)."""
