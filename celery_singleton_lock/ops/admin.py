"""Reading and clearing lock keys: what ``celery locks`` and ``clear_locks`` share, and
:func:`skip_info`, which tells whether a task run was skipped as a duplicate.

Keys are found with SCAN (never KEYS) and read against the Redis server's clock. Clearing
deletes only values this package wrote (and their waiters' signal lists), so a glob that
is too broad cannot remove broker data or a classic locker's keys.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis
from celery._state import get_current_app

from celery_singleton_lock._observe import skip_record_key
from celery_singleton_lock.client import redis_for
from celery_singleton_lock.config import settings_for
from celery_singleton_lock.engine.keyspace import SLOT, SLOTS, companion_key, split_key
from celery_singleton_lock.engine.protocol import SIGNAL_TTL_MS
from celery_singleton_lock.engine.value import Holder, LockValue, parse_value
from celery_singleton_lock.engine.wire import LockClient, server_time

if TYPE_CHECKING:
    from celery import Celery
    from celery.result import AsyncResult

__all__ = [
    "HEADINGS",
    "LockRow",
    "Skip",
    "clear_locks",
    "decode_key",
    "delete_locks",
    "lock_glob",
    "lock_row",
    "prefix_pattern",
    "read_locks",
    "scan_pages",
    "scan_values",
    "signal_key_of",
    "skip_info",
]

#: Keys asked for per SCAN call, and keys read or deleted per pipeline.
SCAN_COUNT = 500
#: Suffix of the waiters' signal list that sits next to every lock key.
SIGNAL_SUFFIX = "signal"
_GLOB_SPECIAL = re.compile(r"([\\*?\[\]])")


def _glob_escape(text: str) -> str:
    """``text`` as a literal inside a Redis glob pattern."""
    return _GLOB_SPECIAL.sub(r"\\\1", text)


def prefix_pattern(prefix: str) -> str:
    """The SCAN pattern of every key under ``prefix`` (``prefix:*``, glob-escaped)."""
    return f"{_glob_escape(prefix)}:*"


def decode_key(key: bytes | str) -> str:
    """A key as text; bytes that are not UTF-8 are shown escaped."""
    return key.decode("utf-8", "backslashreplace") if isinstance(key, bytes) else key


def scan_pages(client: LockClient, pattern: str) -> Iterator[list[bytes | str]]:
    """Pages of the keys matching ``pattern`` (SCAN on every node of a cluster; each key
    once)."""
    seen: set[bytes | str] = set()
    page: list[bytes | str] = []
    for key in client.scan_iter(match=pattern, count=SCAN_COUNT):
        if key in seen:
            continue
        seen.add(key)
        page.append(key)
        if len(page) >= SCAN_COUNT:
            yield page
            page = []
    if page:
        yield page


@dataclass(frozen=True)
class LockRow:
    """One lock key as ``locks list`` shows it.

    ``kind`` is ``"lock"`` (written by this package), ``"classic"`` (a plain expiry
    timestamp from a SETNX locker in another language) or ``"foreign"`` (any other
    string; held while the key has a TTL). ``lease_left`` is in seconds, None when free.
    """

    key: str
    kind: str
    held: bool
    lease_left: float | None
    fence: int | None
    info: dict[str, Any]

    @property
    def task_id(self) -> str | None:
        return _text(self.info.get("task_id"))

    @property
    def task(self) -> str | None:
        return _text(self.info.get("task"))

    @property
    def host(self) -> str | None:
        return _text(self.info.get("host"))

    @property
    def pid(self) -> int | None:
        pid = self.info.get("pid")
        return pid if isinstance(pid, int) and not isinstance(pid, bool) else None

    @property
    def queued(self) -> bool:
        return self.info.get("queued") is True

    def as_json(self) -> dict[str, Any]:
        """The row as a JSON object (``--json``)."""
        return {
            "key": self.key,
            "kind": self.kind,
            "held": self.held,
            "task_id": self.task_id,
            "task": self.task,
            "host": self.host,
            "pid": self.pid,
            "lease_left": self.lease_left,
            "fence": self.fence,
            "queued": self.queued,
            "info": self.info,
        }

    def cells(self) -> tuple[str, ...]:
        """The row as table cells (``-`` where nothing is known)."""
        if self.kind == "classic":
            what = "(classic timestamp)"
        elif self.kind == "foreign":
            what = "(foreign value)"
        else:
            what = self.task or _text(self.info.get("text")) or "-"
        where = self.host or "-"
        if self.pid is not None:
            where = f"{where}/{self.pid}"
        lease = f"{self.lease_left:.1f}s" if self.lease_left is not None else "expired"
        return (
            self.key,
            self.task_id or "-",
            what,
            where,
            lease,
            str(self.fence) if self.fence is not None else "-",
            "yes" if self.queued else "no",
        )


HEADINGS = ("KEY", "TASK ID", "TASK", "HOST/PID", "LEASE LEFT", "FENCE", "QUEUED")


def _text(value: object) -> str | None:
    """A holder-info field as text, None when absent."""
    return None if value is None else str(value)


def _info(value: LockValue) -> dict[str, Any]:
    """The holder info of a value whose lease has ended (as ``Holder.info`` reads it)."""
    if not value.info:
        return {}
    try:
        info = json.loads(value.info)
    except ValueError:
        return {"text": value.info}
    return info if isinstance(info, dict) else {"text": value.info}


def lock_row(key: str, raw: bytes | str, ttl_ms: int, now_ms: int) -> LockRow:
    """The row of one lock key from its value, its PTTL and the server time; never raises."""
    value = parse_value(raw)
    if value.expiry_ms is None:
        kind = "foreign"
    elif value.classic:
        kind = "classic"
    else:
        kind = "lock"
    holder: Holder | None = value.holder(now_ms, ttl_ms if ttl_ms >= 0 else None)
    if holder is None:
        return LockRow(key, kind, held=False, lease_left=None, fence=value.fence, info=_info(value))
    remaining = holder.remaining_ms
    return LockRow(
        key,
        kind,
        held=True,
        lease_left=round(remaining / 1000, 3) if remaining is not None else None,
        fence=holder.fence,
        info=holder.info,
    )


def scan_values(client: LockClient, pattern: str) -> Iterator[tuple[str, Any, int, int]]:
    """``(key, value, PTTL, server ms)`` of every key matching ``pattern``, the value None
    when the key went since SCAN, or the error a non-string key gave. Each SCAN page is read
    with TIME and one pipeline (GET and PTTL per key)."""
    for page in scan_pages(client, pattern):
        # TIME on its own: Redis Cluster pipelines refuse keyless commands (there it is one
        # node's clock, close enough for a listing).
        now_ms, _ = server_time(client)
        pipe = client.pipeline(transaction=False)
        for key in page:
            pipe.get(key)
            pipe.pttl(key)
        replies = pipe.execute(raise_on_error=False)
        for index, key in enumerate(page):
            ttl = replies[1 + 2 * index]
            yield decode_key(key), replies[2 * index], ttl if isinstance(ttl, int) else -1, now_ms


def read_locks(client: LockClient, pattern: str, *, foreign: bool = True) -> list[LockRow]:
    """Every string key matching ``pattern`` as a row, sorted by key (see
    :func:`scan_values`). Keys that are not strings (the waiters' signal lists) are
    skipped, as are keys deleted meanwhile and, unless ``foreign``, values that are neither
    ours nor a classic timestamp.
    """
    rows: list[LockRow] = []
    for key, raw, ttl, now_ms in scan_values(client, pattern):
        if raw is None or isinstance(raw, redis.ResponseError):
            continue  # gone since SCAN, or not a string (WRONGTYPE): not a lock
        if isinstance(raw, Exception):
            raise raw
        row = lock_row(key, raw, ttl, now_ms)
        if foreign or row.kind != "foreign":
            rows.append(row)
    rows.sort(key=lambda row: row.key)
    return rows


def signal_key_of(key: str) -> str | None:
    """The waiters' signal list of lock ``key``, None when it cannot have one."""
    try:
        return companion_key(key, SIGNAL_SUFFIX)
    except ValueError:
        return None


def _slot_index_of(key: str) -> tuple[str, int] | None:
    """(the slot index of the lock, the slot number) of a deleted lock key or slot key."""
    lock, suffix = split_key(key)
    number = 1
    if suffix.startswith(SLOT):
        digits = suffix[len(SLOT) :]
        if not digits.isdigit():
            return None
        number = int(digits)
    elif suffix:
        return None
    try:
        return companion_key(lock, SLOTS), number
    except ValueError:
        return None


def delete_locks(client: LockClient, keys: Sequence[str]) -> int:
    """Delete the given lock keys; returns how many locks went.

    Each lock's signal list gets one wake-up (as a release gives it, expiring unread after
    a moment), so a task waiting on a cleared lock takes it at once instead of at its next
    fallback poll. One DEL per key, so keys in different Redis Cluster slots are fine.
    """
    cleared = 0
    for start in range(0, len(keys), SCAN_COUNT):
        batch = keys[start : start + SCAN_COUNT]
        pipe = client.pipeline(transaction=False)
        for key in batch:
            pipe.delete(key)
        deleted = [int(reply) for reply in pipe.execute()]
        cleared += sum(deleted)
        pipe = client.pipeline(transaction=False)
        for key, gone in zip(batch, deleted, strict=True):
            signal = signal_key_of(key)
            if gone and signal is not None:
                pipe.rpush(signal, "1")
                pipe.pexpire(signal, SIGNAL_TTL_MS)
            index = _slot_index_of(key)
            if gone and index is not None:
                # a lock with slots: its index beside the lock says the slot is free again
                pipe.zadd(index[0], {str(index[1]): index[1]}, xx=True)
        pipe.execute()
    return cleared


def lock_glob(prefix: str, pattern: str) -> str:
    """The SCAN glob of ``pattern`` below ``prefix`` (taken as is when it already starts
    with ``prefix:``)."""
    under = f"{prefix}:"
    return pattern if pattern.startswith(under) else prefix_pattern(prefix)[:-1] + pattern


def clear_locks(app: Celery, pattern: str = "*") -> int:
    """Remove this app's locks whose key matches the glob ``pattern``; return how many.

    ``pattern`` is matched below ``singleton_lock_prefix`` (``"orders.*"`` means
    ``<prefix>:orders.*``; a pattern that already starts with the prefix is taken as is).
    Only values this package wrote are deleted, with their signal lists: other keys under
    the prefix, and everything outside it, are never touched.
    """
    settings = settings_for(app)
    glob = lock_glob(settings.prefix, pattern)
    client = redis_for(app, settings.url)
    ours = [row.key for row in read_locks(client, glob, foreign=False) if row.kind == "lock"]
    return delete_locks(client, ours)


@dataclass(frozen=True)
class Skip:
    """How a run was skipped as a duplicate: the lock ``key`` it found held, the task id
    of the run holding it (None when unknown), the task's name, when (Unix time), and why:
    ``reason`` is ``"held"`` (another run held the key) or ``"throttled"`` (the key's
    ``lock_rate_limit`` was used up). ``explanation`` is why the key blocked as the run was
    skipped (its holders, waiters, throttle ...: ``Explanation.as_json()`` of
    :mod:`celery_singleton_lock.explain`, read back with ``Explanation.from_json``), None
    when it could not be read."""

    key: str
    holder_task_id: str | None
    task: str
    at: float
    reason: str = "held"
    explanation: dict[str, Any] | None = None


def skip_info(result: AsyncResult[Any], app: Celery | None = None) -> Skip | None:
    """Whether the run of ``result`` was skipped as a duplicate (policy ``skip``): a
    :class:`Skip` if it was, None if it ran (or is not done, or its record expired).

    A skipped run succeeds with the result None, like a body that returned None; the worker
    keeps a record beside the locks (as long as ``result_expires``, a day by default), so
    this tells the two apart. ``app`` defaults to the result's app (an ``EagerResult``
    has none: then Celery's current app). One GET on the lock Redis.
    """
    app = app or getattr(result, "app", None) or get_current_app()
    settings = settings_for(app)
    client = redis_for(app, settings.url)
    raw = client.get(skip_record_key(settings.prefix, str(result.id)))
    if raw is None:
        return None
    record = json.loads(raw)
    holder = record.get("holder_task_id")
    explanation = record.get("explanation")
    return Skip(
        key=str(record["key"]),
        holder_task_id=str(holder) if holder is not None else None,
        task=str(record.get("task", "")),
        at=float(record.get("at", 0.0)),
        reason=str(record.get("reason", "held")),
        explanation=explanation if isinstance(explanation, dict) else None,
    )
