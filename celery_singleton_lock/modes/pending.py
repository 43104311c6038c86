"""The state of ``coalesce`` and ``replace`` (:mod:`.followup`): the key's pending
follow-up ``<base>pending``, a hash of the follow-up's task id (``id``), the holder info of
the first call it stands for (``info``) and the call itself, as an explanation and
``celery locks list`` show it.

It lives beside :mod:`.followup`, not in it, because the explanation that a conflict
policy attaches to ``TaskLocked`` reads every mode's state, and :mod:`.followup` stands on
the policies: this module stands on nothing but the face protocol.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from celery_singleton_lock.engine.keyspace import PENDING, companion_key
from celery_singleton_lock.modes.face import (
    Asked,
    Face,
    Lines,
    fields,
    holder_info,
    pid_of,
    text,
    who,
)

if TYPE_CHECKING:
    from celery_singleton_lock.engine.wire import LockClient

__all__ = ["FollowUp", "FollowUpFace", "pending_id"]


@dataclass(frozen=True)
class FollowUp:
    """The key's pending follow-up (``coalesce``, ``replace``): the call that runs when the
    holder ends, under ``task_id``; ``host`` and ``pid``: the process that made the first
    call it stands for."""

    task_id: str
    task: str | None = None
    host: str | None = None
    pid: int | None = None

    def describe(self) -> str:
        where = "/".join(str(part) for part in (self.host, self.pid) if part is not None)
        called = f", called on {where}" if where else ""
        return f"{who(self.task, self.task_id, None, None)}{called}: runs when the holder ends"


class FollowUpFace(Face):
    """``follow_up``: the pending follow-up, None when there is none."""

    suffixes = (PENDING,)
    fields = ("follow_up",)

    def first(self, asked: Asked, pipe: Any) -> None:
        pipe.hmget(asked.companion(PENDING), ["id", "info"])

    def parts(self, asked: Asked, first: list[Any], second: list[Any]) -> dict[str, Any]:
        task_id, info_text = first[0]
        if not text(task_id):
            return {"follow_up": None}
        info = holder_info(text(info_text))
        task, host = text(info.get("task")), text(info.get("host"))
        return {"follow_up": FollowUp(text(task_id) or "", task, host, pid_of(info))}

    def lines(self, explanation: Any) -> Lines:
        follow_up = explanation.follow_up
        return [("Follow-up", follow_up.describe())] if follow_up is not None else []

    def as_json(self, explanation: Any) -> dict[str, Any]:
        follow_up = explanation.follow_up
        return {"follow_up": fields(follow_up) if follow_up is not None else None}

    def from_json(self, data: Mapping[str, Any]) -> dict[str, Any]:
        found = data.get("follow_up")
        return {"follow_up": FollowUp(**found) if found else None}


def pending_id(client: LockClient, key: str) -> str | None:
    """The task id of lock ``key``'s pending follow-up, None when there is none."""
    found = cast("Any", client).hget(companion_key(key, PENDING), "id")
    return found.decode("utf-8", "backslashreplace") if isinstance(found, bytes) else found
