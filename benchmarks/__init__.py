"""Benchmarks for celery-singleton-lock (run with ``python -m benchmarks.bench_lock``)."""
