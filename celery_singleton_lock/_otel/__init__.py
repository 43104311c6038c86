"""The parts of :mod:`celery_singleton_lock.otel`: span bookkeeping and signal receivers."""
