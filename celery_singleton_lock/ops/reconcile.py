"""Reconciliation: who holds, waits for and follows each lock (``celery locks list``), and
freeing only holds whose holder is proven gone (``celery locks reap``).

A hold is proven gone when all of these are true:

* its lease was not renewed while we watched it for one renewal interval (a running task's
  lease is extended every third of a lease, so a live one moves);
* no worker that answers ``inspect`` lists its task id as active, reserved or scheduled;
* it is not waiting in the broker: for a Redis broker we look in the queues and in the
  messages delivered but not acknowledged; with another broker a hold taken at publish
  (queue scope, not yet running) is never proven gone.

Anything else is left alone: a hold whose renewal we saw, whose task a worker reports, or
that may still be queued. Freeing is owner-checked (the token we saw), so a hold that
changed hands meanwhile is not touched.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from celery_singleton_lock.engine import RedisLock, companion_key
from celery_singleton_lock.engine.value import parse_value
from celery_singleton_lock.engine.wire import LockClient
from celery_singleton_lock.ops.admin import LockRow, decode_key, lock_row, scan_values

if TYPE_CHECKING:
    from celery import Celery

__all__ = ["LockState", "Reaped", "base_of", "lock_states", "reap"]

#: The broker queue entries looked through per queue (a longer queue: not proven absent).
BROKER_SCAN_LIMIT = 100_000
#: How long ``inspect`` waits for workers to answer (seconds).
INSPECT_TIMEOUT = 1.0


def base_of(key: str) -> tuple[str, str]:
    """(lock key, companion suffix) of a key under the prefix: a lock key has suffix ``""``;
    ``<lock>:slot:2`` gives the lock and ``"slot:2"``; ``<lock>:queue`` gives ``"queue"``."""
    close = key.find("}")
    if close != -1 and key.startswith(":", close + 1):
        return key[: close + 1], key[close + 2 :]
    return key, ""


@dataclass
class LockState:
    """One lock as ``locks list`` shows it: its holders (one per slot held), the waiters in
    the order they came (their task ids), and its pending follow-up (a task id)."""

    key: str
    holders: list[LockRow] = field(default_factory=list)
    waiters: list[str] = field(default_factory=list)
    pending: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "holders": [row.as_json() for row in self.holders],
            "waiters": self.waiters,
            "pending": self.pending,
        }


def lock_states(client: LockClient, pattern: str) -> list[LockState]:
    """Every lock under ``pattern`` with its holders (slots included), waiters and pending
    follow-up; companion keys are folded into their lock, never listed as locks."""
    states: dict[str, LockState] = {}
    for key, raw, ttl, now_ms in scan_values(client, pattern):
        lock, suffix = base_of(key)
        if suffix and not suffix.startswith("slot:"):
            continue  # a companion: queue, waiter, grant, signal, done, fence, ...
        if raw is None or isinstance(raw, Exception):
            continue
        row = lock_row(key, raw, ttl, now_ms)
        if row.kind == "foreign" and suffix:
            continue
        states.setdefault(lock, LockState(lock)).holders.append(row)
    for state in states.values():
        state.waiters, state.pending = _queue_of(client, state.key)
    return [states[key] for key in sorted(states)]


def _queue_of(client: LockClient, key: str) -> tuple[list[str], str | None]:
    """The task ids of ``key``'s live waiters in order, and its pending follow-up's."""
    try:
        queue = companion_key(key, "queue")
    except ValueError:
        return [], None
    tokens = [decode_key(token) for token in cast("list[bytes]", client.zrange(queue, 0, -1))]
    pending = client.hget(companion_key(key, "pending"), "id")
    waiters = []
    if tokens:
        values = client.mget([companion_key(key, f"waiter:{token}") for token in tokens])
        for token, value in zip(tokens, values, strict=True):
            if value is None:
                continue  # its place lapsed
            text = decode_key(value).split(":", 1)[-1]
            try:
                info = json.loads(text)
            except ValueError:
                info = {}
            waiters.append(str(info.get("task_id") or token) if isinstance(info, dict) else token)
    return waiters, decode_key(pending) if pending is not None else None


@dataclass(frozen=True)
class Reaped:
    """One hold ``reap`` would free (or freed): its key, task id and why it is gone."""

    key: str
    task_id: str | None
    why: str
    freed: bool


def _worker_task_ids(app: Celery, timeout: float) -> set[str] | None:
    """Task ids that answering workers report as active, reserved or scheduled; None when
    no worker answered."""
    inspect = app.control.inspect(timeout=timeout)
    found: set[str] = set()
    answered = False
    for method in (inspect.active, inspect.reserved, inspect.scheduled):
        replies = method() or {}
        answered = answered or bool(replies)
        for requests in replies.values():
            for request in requests or ():
                task = request.get("request", request) if isinstance(request, dict) else {}
                if isinstance(task, dict) and task.get("id"):
                    found.add(str(task["id"]))
    return found if answered else None


def _broker_messages(app: Celery) -> list[bytes] | None:
    """Every message body waiting or unacknowledged in a Redis broker, None when the broker
    is not Redis or a queue is too long to look through."""
    url = str(app.conf.broker_url or "")
    if not url.startswith(("redis://", "rediss://", "unix://", "redis+socket://")):
        return None
    import redis  # noqa: PLC0415 - only for a Redis broker

    broker = redis.Redis.from_url(url.replace("redis+socket://", "unix://"), socket_timeout=5)
    try:
        names = {app.conf.task_default_queue or "celery"}
        names.update(queue.name for queue in (app.conf.task_queues or ()))
        messages: list[bytes] = []
        for name in names:
            if broker.type(name) != b"list":
                continue
            if broker.llen(name) > BROKER_SCAN_LIMIT:
                return None
            messages.extend(cast("list[bytes]", broker.lrange(name, 0, -1)))
        if broker.type("unacked") == b"hash":
            messages.extend(cast("list[bytes]", broker.hvals("unacked")))
        return messages
    finally:
        broker.close()


def _expiries(client: LockClient, keys: Sequence[str]) -> dict[str, int | None]:
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.get(key)
    found: dict[str, int | None] = {}
    for key, raw in zip(keys, pipe.execute(raise_on_error=False), strict=True):
        value = parse_value(raw) if isinstance(raw, (bytes, str)) else None
        found[key] = value.expiry_ms if value is not None else None
    return found


def reap(
    app: Celery,
    client: LockClient,
    pattern: str,
    *,
    watch: float,
    dry_run: bool,
    scripting: bool = True,
    inspect_timeout: float = INSPECT_TIMEOUT,
) -> list[Reaped]:
    """Free (unless ``dry_run``) every hold under ``pattern`` whose holder is proven gone
    (see the module docstring), watching renewals for ``watch`` seconds."""
    holds = [
        row
        for state in lock_states(client, pattern)
        for row in state.holders
        if row.held and row.kind == "lock" and row.info.get("held") != "success"
    ]
    if not holds:
        return []
    before = _expiries(client, [row.key for row in holds])
    time.sleep(max(0.0, watch))
    after = _expiries(client, [row.key for row in holds])
    known = _worker_task_ids(app, inspect_timeout)
    messages = None if not any(row.queued for row in holds) else _broker_messages(app)
    reaped = []
    for row in holds:
        why = _gone(row, before.get(row.key), after.get(row.key), known, messages)
        if why is None:
            continue
        freed = False
        if not dry_run:
            freed = _free(client, row, scripting)
        reaped.append(Reaped(row.key, row.task_id, why, freed))
    return reaped


def _gone(
    row: LockRow,
    before: int | None,
    after: int | None,
    known: set[str] | None,
    messages: Iterable[bytes] | None,
) -> str | None:
    """Why ``row``'s holder is proven gone, or None when it is not."""
    if after is None or before is None or after != before:
        return None  # released, taken over, or renewed while we watched
    if row.task_id is None:
        return None  # not a task's hold: nothing to ask the workers about
    if known is not None and row.task_id in known:
        return None
    if row.queued:
        if messages is None:
            return None  # the broker cannot be searched: it may still be queued
        needle = row.task_id.encode()
        if any(needle in message for message in messages):
            return None
        return "taken at publish, but its message is in no queue and no worker has it"
    listed = "no answering worker has it" if known is not None else "no worker answered"
    return f"not renewed while watched, and {listed}"


def _free(client: LockClient, row: LockRow, scripting: bool) -> bool:
    """Owner-checked release of ``row``'s hold (by the token we saw)."""
    value = parse_value(client.get(row.key) or b"")
    if value.token is None or value.fence != row.fence:
        return False  # it changed hands since we looked
    lock, suffix = base_of(row.key)
    limit = int(suffix.split(":", 1)[1]) if suffix.startswith("slot:") else 1
    owner = RedisLock(
        client, lock, token=value.token, scripting=scripting, limit=limit if scripting else 1
    )
    try:
        owner.release()
    except Exception:  # noqa: BLE001 - not owned any more, or Redis refused: not freed
        return False
    return True
