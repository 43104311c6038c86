"""``lock_release``: when a run's key frees, if not at the end of the run.

``"start"`` frees it as the body starts (queue scope), so a call made from then on publishes
a new message. ``"success"`` keeps the key of a run that succeeded for ``lock_hold`` more
seconds: its hold becomes an unrenewed hold (same owner and fencing token, server clock)
naming that task id, so a queue-scope duplicate gets its ``AsyncResult``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from celery import states

from celery_singleton_lock.engine import atomic
from celery_singleton_lock.exceptions import LockBackendError, LockNotOwned
from celery_singleton_lock.modes.base import Mode
from celery_singleton_lock.options import Combination, no_scripts

if TYPE_CHECKING:
    from celery_singleton_lock.modes.base import Release, Run
    from celery_singleton_lock.options import LockOptions

__all__ = ["HoldAfterSuccess", "ReleaseAtStart", "held_after_success"]

log = logging.getLogger("celery_singleton_lock.task")


class ReleaseAtStart(Mode):
    """``lock_release="start"``."""

    name = "start"
    rules: ClassVar[tuple[Combination, ...]] = (
        Combination(
            lambda o, _: o.release == "start" and o.scope != "queue",
            "lock_release='start' needs lock_scope='queue' (in run scope the key is taken as "
            "the body starts, so freeing it then would lock nothing)",
        ),
    )

    @classmethod
    def applies(cls, options: LockOptions) -> bool:
        return options.release == cls.name

    def start(self, run: Run) -> bool:
        try:
            run.lock.release()
        except LockNotOwned:
            run.released("STARTED", held=False)
        except LockBackendError as exc:
            log.error(
                "could not release lock %s of task %s at its start: %s (it frees at its lease end)",
                run.key,
                run.task_id,
                exc,
            )
        else:
            run.released("STARTED", held=True)
        return False


def held_after_success(info: Mapping[str, Any]) -> bool:
    """Whether a hold's holder info marks it a success hold (``lock_release="success"``:
    nobody runs it, the key is kept on purpose), as ``_held_info`` writes it."""
    return info.get("held") == "success"


def _held_info(holder_info: str) -> str:
    """The holder info of a success hold: the run's, marked ``"held": "success"`` and
    without its pid and process (no process runs it any more, so nobody frees it for a
    lost process)."""
    try:
        info = json.loads(holder_info)
    except ValueError:
        return holder_info
    if not isinstance(info, dict):
        return holder_info
    info.pop("pid", None)
    info.pop("proc", None)
    info["held"] = "success"
    return json.dumps(info, sort_keys=True, separators=(",", ":"))


class HoldAfterSuccess(Mode):
    """``lock_release="success"`` with ``lock_hold``: at most one success per hold time."""

    name = "success"
    rules: ClassVar[tuple[Combination, ...]] = (
        Combination(
            lambda o, _: o.release == "success" and o.hold is None,
            "lock_release='success' needs lock_hold=<seconds>: how long a successful run "
            "keeps the key",
        ),
        Combination(
            lambda o, _: o.hold is not None and o.release != "success",
            "lock_hold is only meaningful with lock_release='success' (it is how long a "
            "successful run keeps the key)",
        ),
        Combination(
            lambda o, s: o.release == "success" and no_scripts(s),
            "lock_release='success' needs Lua scripts, which singleton_lock_scripting=False "
            "turns off",
        ),
    )

    @classmethod
    def applies(cls, options: LockOptions) -> bool:
        return options.release == cls.name and options.hold is not None

    def release(self, ending: Release, state: str | None) -> bool:
        """A successful run keeps its key ``lock_hold`` seconds from now (with the record a
        release would write); a Redis error leaves it to the ordinary release."""
        options, lock = ending.options, ending.lock
        if state != states.SUCCESS or options.hold is None or lock.token is None:
            return False
        hold_ms = max(1, round(options.hold * 1000))
        try:
            expiry = atomic.hold(lock, hold_ms, _held_info(lock.holder_info), ending.record)
        except LockBackendError as exc:
            log.error(
                "could not hold lock %s after task %s succeeded: %s", lock.name, ending.task_id, exc
            )
            return False
        lock.detach()
        ending.released(state, held=bool(expiry), hold=options.hold)
        return True
