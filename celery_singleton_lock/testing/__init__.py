"""Helpers for test suites and demos: a private ``redis-server`` and real Celery processes.

``RedisServer`` starts ``redis-server`` on a free loopback port with persistence off, waits
until it answers, and stops exactly that process (by PID) on exit; it can also be paused
(SIGSTOP) and restarted empty on the same port. ``FaultProxy`` sits between a client and
a server and can stall or cut the connections, as a network would. ``CeleryWorker`` and
``CeleryBeat`` run ``python -m celery -A <module> worker|beat`` in a process group of their
own, wait (bounded) until it is ready, and stop the whole group: SIGTERM (Celery's warm
shutdown), then SIGKILL after a timeout. Our own tests, the benchmarks and the examples all
use them; users can use them in their suites too::

    with RedisServer() as server, CeleryWorker("proj.tasks", broker_url=server.url) as worker:
        assert proj.tasks.add.delay(1, 2).get(timeout=10) == 3

One module per job: ``servers`` (the server binary, ports, ``RedisServer``), ``faults``
(``FaultProxy``) and ``processes`` (the Celery processes); this module only re-exports
them. None of them imports Celery: they start it as a subprocess.
"""

from __future__ import annotations

from celery_singleton_lock.testing.faults import FaultProxy
from celery_singleton_lock.testing.processes import (
    CeleryBeat,
    CeleryProcess,
    CeleryWorker,
    process_group_alive,
)
from celery_singleton_lock.testing.servers import SERVER_NAMES as SERVER_NAMES
from celery_singleton_lock.testing.servers import (
    RedisServer,
    find_redis_server,
    free_port,
)
from celery_singleton_lock.testing.servers import embedded_server as embedded_server

__all__ = [
    "CeleryBeat",
    "CeleryProcess",
    "CeleryWorker",
    "FaultProxy",
    "RedisServer",
    "find_redis_server",
    "free_port",
    "process_group_alive",
]
