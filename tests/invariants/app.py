"""The Celery app of the invariant runner: one locked task per mode (:mod:`.modes`), whose
bodies record to the ledger (:mod:`.recording`).

The driver (:mod:`.runner`) and every ``celery worker`` it starts import this module; the
servers come from the environment:

- ``INV_BROKER``: the broker; ``INV_BACKEND``: the result backend (both on a redis-server
  no fault touches);
- ``INV_LOCK``: the lock Redis (the one that is stalled and restarted);
- ``INV_LEDGER``: the ledger (a private redis-server no fault touches);
- ``INV_LEASE``: ``singleton_lock_timeout`` (seconds); ``INV_VISIBILITY``: the broker's
  visibility timeout (seconds);
- ``INV_WORKER``: a label for this process's records (``w1``, ``driver``);
- ``INV_MODES``: the modes whose tasks are defined (comma-separated; default every mode):
  a scenario's own, so a threads-pool worker is not refused for a task that needs prefork
  (``lock_replace_running``).

Messages are acknowledged after their run (``acks_late``) and a run whose pool process died
is handed out again (``reject_on_worker_lost``): at-least-once delivery, so a killed run
comes back, and the lock must make that safe.
"""

from __future__ import annotations

import os

from celery import Celery

from tests.invariants.modes import MODES, register
from tests.invariants.recording import Recorder

BROKER = os.environ.get("INV_BROKER", "redis://127.0.0.1:6379/0")
BACKEND = os.environ.get("INV_BACKEND", BROKER)
LOCK = os.environ.get("INV_LOCK", BROKER)
LEDGER = os.environ.get("INV_LEDGER", BROKER)
LEASE = float(os.environ.get("INV_LEASE", "8"))
VISIBILITY_TIMEOUT = float(os.environ.get("INV_VISIBILITY", "12"))
WORKER = os.environ.get("INV_WORKER", "driver")
#: Task names are ``inv.<mode>``; the ledger's keys ``inv:*``.
PREFIX = "inv"
QUEUE = "invariants"

app = Celery("invariants", broker=BROKER, backend=BACKEND, set_as_current=True)
app.conf.update(
    task_default_queue=QUEUE,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    broker_transport_options={
        "visibility_timeout": VISIBILITY_TIMEOUT,
        # Sweep unacknowledged messages every second: a killed worker's messages come back
        # about one visibility timeout after it died.
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
        # The sweep runs under a broker-side mutex whose default expiry is 300 s: a worker
        # killed while it sweeps would stop every sweep for 5 minutes.
        "unacked_mutex_expire": 10,
    },
    broker_connection_retry_on_startup=True,
    result_expires=3600,
    result_backend_transport_options={"retry_policy": {"max_retries": 2, "interval_max": 0.2}},
    singleton_lock_url=LOCK,
    singleton_lock_timeout=LEASE,
    singleton_lock_prefix="inv",
)

recorder = Recorder(LEDGER, "inv", PREFIX, WORKER)
recorder.connect()
SELECTED = [name for name in os.environ.get("INV_MODES", "").split(",") if name] or list(MODES)
TASKS = register(app, recorder.body, prefix=PREFIX, modes={name: MODES[name] for name in SELECTED})
