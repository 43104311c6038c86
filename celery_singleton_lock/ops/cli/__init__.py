"""The ``celery locks`` sub-command: see, clear and compute the keys of singleton locks.

Installed through the ``celery.commands`` entry point, so it runs with the app given to
``celery -A proj``::

    celery -A proj locks list [--json] [--match PATTERN]
    celery -A proj locks clear KEY... | --all | --match PATTERN [--yes]
    celery -A proj locks key TASK_NAME [ARGS_JSON [KWARGS_JSON]]
    celery -A proj locks explain TASK [ARGS...] [--kwargs JSON] [--json]
    celery -A proj locks check [--json] [--strict]
    celery -A proj locks limit set NAME N | unset NAME | list [--json]
    celery -A proj locks beat [--json] [--group NAME]

``list`` and ``clear`` talk to the lock Redis (``singleton_lock_url``) with SCAN, never
KEYS, and read lock state against the Redis server's clock; ``clear --all`` and ``--match``
delete through :func:`.admin.clear_locks`. ``key`` needs no Redis: it derives the key the
same way a task call does. ``check`` is a preflight of the lock Redis for CI (exit status 0
when ready; see :mod:`.checks`). ``limit`` sets and shows the numbers of stacked limits
(``lock_limits``) at run time (see :mod:`.limits`). Passwords are masked in every printed
URL.

One module per command (``listing``, ``clear``, ``key``, ``explain``, ``check``,
``reap``, ``limit``, ``beat``) on the helpers they share (``_common``); this module only
builds the ``locks`` group from them (``celery.commands`` entry point:
``celery_singleton_lock.ops.cli:locks``).
"""

from __future__ import annotations

from typing import Any

import click
from celery.bin.base import handle_preload_options

# Celery loads every ``celery.commands`` entry point for any sub-command, so importing
# ``integration`` here wires config-locked tasks in ``celery worker``/``beat`` processes.
from celery_singleton_lock import integration  # noqa: F401
from celery_singleton_lock.config import EX_CONFIG
from celery_singleton_lock.ops.admin import read_locks as read_locks  # (as before the split)
from celery_singleton_lock.ops.cli._common import EX_NOPERM
from celery_singleton_lock.ops.cli.beat import beat_state
from celery_singleton_lock.ops.cli.check import check
from celery_singleton_lock.ops.cli.clear import clear
from celery_singleton_lock.ops.cli.explain import explain
from celery_singleton_lock.ops.cli.key import key_for
from celery_singleton_lock.ops.cli.limit import limit
from celery_singleton_lock.ops.cli.listing import _EXTRA as _EXTRA  # (as before the split)
from celery_singleton_lock.ops.cli.listing import list_locks
from celery_singleton_lock.ops.cli.reap import reap_locks

__all__ = ["EX_CONFIG", "EX_NOPERM", "locks"]


@click.group()
@click.pass_context
@handle_preload_options
def locks(ctx: click.Context, **kwargs: Any) -> None:
    """List, clear and compute the keys of singleton locks."""


for _command in (list_locks, clear, key_for, explain, check, reap_locks, limit, beat_state):
    locks.add_command(_command)
