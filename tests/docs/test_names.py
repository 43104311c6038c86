"""Every name the README, the docs pages and the CHANGELOG write in backticks exists in the
code: dotted Python names, options, settings, worker events, signals, metrics, ``celery
locks`` commands, Lua scripts, Redis commands, key forms and paths (``tests/docs/names.py``
says how each kind is recognised and looked up). The CHANGELOG's history counts: a name an
entry gives must still resolve, or the entry must say what it is called now."""

from __future__ import annotations

import pytest
import redis

from celery_singleton_lock.testing import RedisServer
from tests.docs.names import Resolver, Span, backticked

#: Spans that look like names but are not the package's, each with the reason.
ALLOWED = {
    "lock_timout=5": "configuration.md: a misspelt option, shown to say it is refused",
    "singleton_backend": "migration.md: a private name of celery-singleton the shim lacks",
    "singleton_config": "migration.md: a private name of celery-singleton the shim lacks",
    "RedisBackend": "migration.md: a private name of celery-singleton the shim lacks",
    "OverLimit": "modes.md: Sidekiq Enterprise's limiter error, in the comparison table",
    "celery.task_id": "observability.md: an OpenTelemetry span attribute, not a module",
    "celery.task_name": "observability.md: an OpenTelemetry span attribute, not a module",
    "celery.commands": "operations.md: the entry-point group Celery loads commands from",
    "celery.conf.update(flask_app.config)": "migration.md: a Flask app's `celery` object",
    "PX lease+grace": "design.md: the PX argument of SET, not a command",
    "BIGINT": "guarantees.md: the SQL column type a fencing token fits in",
    "TOKEN": "usage.md: a placeholder for an owner token",
    "ARG": "operations.md: one of the ARGS of the explain synopsis",
    "DatabaseScheduler": "beat.md: django-celery-beat's scheduler class (not installed here)",
}


@pytest.fixture(scope="module")
def resolver(redis_server: RedisServer) -> Resolver:
    """A resolver that knows the Redis commands of a real server."""
    client = redis.Redis.from_url(redis_server.url)
    try:
        commands = [
            command.decode() if isinstance(command, bytes) else str(command)
            for command in client.command_list()
        ]
    finally:
        client.close()
    return Resolver(commands)


def test_every_backticked_name_resolves(resolver: Resolver) -> None:
    """A backticked name of a known kind that the code does not define fails, with its
    page, line and why; the allow-list holds only spans that are not ours, with reasons."""
    problems = []
    used = set()
    for span in backticked():
        if span.text in ALLOWED:
            used.add(span.text)
            continue
        why = resolver.problem(span.text)
        if why is not None:
            problems.append(f"{span}: {why}")
    assert not problems, "\n".join(problems)
    assert used == set(ALLOWED), f"allowed but never written: {set(ALLOWED) - used}"


@pytest.mark.parametrize(
    ("text", "resolves"),
    [
        ("celery_singleton_lock.modes.COMBINATIONS", True),
        ("celery_singleton_lock.options.COMBINATIONS", False),
        ("celery_singleton_lock.lock", False),
        ("celery_singleton_lock.ops.admin", True),
        ("RedisLock(fair_after=T)", True),
        ("RedisLock(fairness=T)", False),
        ("lock_limits", True),
        ("lock_limitz", False),
        ("singleton_lock_url", True),
        ("singleton_lock_urls", False),
        ("task_acks_late", True),
        ("task_ack_late", False),
        ("CELERY_SINGLETON_LOCK_PREFIX", True),
        ("task-lock-parked", True),
        ("task-lock-acquired", False),
        ("lock-parked", False),
        ("celery_singleton_lock_limit_in_use", True),
        ("celery_singleton_lock_throttled_total{task,policy}", True),
        ("celery_singleton_lock_throttled_total{key}", False),
        ("celery locks limit set NAME N", True),
        ("celery -A proj locks list [--json] [--match PATTERN]", True),
        ("celery locks list --verbose", False),
        ("celery locks purge", False),
        ("ACQUIRE_SLOTS", True),
        ("ACQUIRE_STACK", False),
        ("<base>queue", True),
        ("<key>:parkdata", True),
        ("<key>:parking", False),
        ("<prefix>:{<prefix>:stack}:limits", True),
        ("tests/lock/test_stack.py", True),
        ("tests/lock/test_stacks.py", False),
        ("prose in backticks", True),
    ],
)
def test_the_resolver_tells_names_from_non_names(
    resolver: Resolver, text: str, resolves: bool
) -> None:
    """Known names resolve, misspelt ones of each kind do not, prose is left alone."""
    assert (resolver.problem(text) is None) is resolves, resolver.problem(text)


def test_spans_are_read_outside_code_blocks() -> None:
    """Spans come with their page and line; fenced blocks are skipped."""
    spans = list(backticked(["README.md"]))
    assert spans
    assert all(isinstance(span, Span) and span.line >= 1 for span in spans)
    assert not any(span.text.startswith("pip install") and span.line < 5 for span in spans)
