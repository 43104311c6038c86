"""The parts of :mod:`celery_singleton_lock.metrics`: metric objects, receivers, limit gauges."""
