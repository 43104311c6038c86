"""Why a key blocks: who holds it, who waits for it, what is parked, pending, throttled or
debouncing there, read from the lock Redis on its own clock (the public face is
:mod:`celery_singleton_lock.explain`).

:func:`explain_key` is the driver: it runs every state face of :data:`.faces.FACES` (the
lock's own part first: holders, slots, waiters; then each mode's) over two pipelined round
trips, and never decodes a mode's state itself. The first round trip carries the server's
``TIME`` and each face's first reads; the second what depends on them or on the clock (it
is skipped when no face has anything to read then). All the keys share the lock's hash
slot, so a Redis Cluster adds one round trip, for its node's ``TIME``; never a SCAN. At
most ``most`` waiters, parked calls and slot holders are listed (the totals are exact).

It sits below the conflict policies, so that a policy can attach an explanation to a
``TaskLocked`` or to a skip record (:func:`conflict_explanation`, which never raises).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from redis.cluster import RedisCluster

from celery_singleton_lock.engine.wire import LockClient, call, server_time, time_reply
from celery_singleton_lock.exceptions import LockError
from celery_singleton_lock.modes.burst import Burst
from celery_singleton_lock.modes.face import Asked, Face, Lines
from celery_singleton_lock.modes.faces import FACES
from celery_singleton_lock.modes.held import LimitUse
from celery_singleton_lock.modes.holders import Held, Waiter
from celery_singleton_lock.modes.parking import Handed, Parked
from celery_singleton_lock.modes.pending import FollowUp
from celery_singleton_lock.modes.starts import Throttle

if TYPE_CHECKING:
    from celery_singleton_lock.engine.stack import Stack
    from celery_singleton_lock.options import LockOptions

__all__ = [
    "CONFLICT_MOST",
    "MOST",
    "STATES",
    "Explanation",
    "conflict_explanation",
    "explain_key",
]

log = logging.getLogger("celery_singleton_lock.task")

#: How many waiters, parked calls, handed calls and slot holders an explanation lists.
MOST = 50
#: The same, for the explanation a conflict attaches to a ``TaskLocked`` or a skip record.
CONFLICT_MOST = 10
#: The states of a key, as :attr:`Explanation.state` names them.
STATES = ("free", *(state for face in FACES for state in face.states))


@dataclass(frozen=True)
class Explanation:
    """Why a key blocks a call, as the lock Redis had it at server time ``now`` (Unix
    seconds).

    ``state`` is the first of ``states`` (``"free"`` when none applies): ``"held"`` or
    ``"held after success"``, ``"parked"``, ``"throttled"``, ``"debouncing"``, ``"limited"``
    (a stacked limit of the call has no room for its weight: ``limits``). ``holders``
    are the holds (one per slot held; an expired one, whose key the next call takes over,
    is listed too), ``slots`` the key's ``lock_limit`` and ``slots_held`` how many are
    held. ``waiters``, ``parked`` and ``handed`` list at most a bound of each, in turn
    order; ``waiting`` and ``parked_total`` are the totals. ``as_json()`` is a plain dict
    (what ``TaskLocked.explanation`` and a skip record carry), :meth:`from_json` reads one
    back, ``str()`` is the text ``celery locks explain`` prints. ``weight_error``: why the
    task's ``lock_weight`` gave no weight for this call (the limits are listed without
    one, and nothing says whether the call fits); None, and left out of the JSON, when
    it gave one. Each part comes from its face (:data:`.faces.FACES`).
    """

    key: str
    now: float
    task: str | None = None
    holders: tuple[Held, ...] = ()
    slots: int = 1
    slots_held: int = 0
    waiters: tuple[Waiter, ...] = ()
    waiting: int = 0
    parked: tuple[Parked, ...] = ()
    parked_total: int = 0
    handed: tuple[Handed, ...] = ()
    follow_up: FollowUp | None = None
    throttle: Throttle | None = None
    debounce: Burst | None = None
    limits: tuple[LimitUse, ...] = ()
    states: tuple[str, ...] = field(default=())
    weight_error: str | None = None

    @property
    def state(self) -> str:
        return self.states[0] if self.states else "free"

    @property
    def holder(self) -> Held | None:
        """The live holder (with slots, the newest one), or None."""
        live = [held for held in self.holders if held.live]
        return max(live, key=lambda held: held.fence or 0) if live else None

    def as_json(self) -> dict[str, Any]:
        """The explanation as JSON values (``celery locks explain --json``)."""
        found: dict[str, Any] = {
            "key": self.key,
            "task": self.task,
            "state": self.state,
            "states": list(self.states),
            "now": self.now,
        }
        for face in FACES:
            found.update(face.as_json(self))
        return found

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Explanation:
        """An explanation from :meth:`as_json`'s dict (as ``TaskLocked.explanation`` and
        ``skip_info(result).explanation`` carry it)."""
        parts: dict[str, Any] = {}
        for face in FACES:
            parts.update(face.from_json(data))
        return cls(
            key=str(data["key"]),
            now=float(data["now"]),
            task=data.get("task"),
            states=tuple(data.get("states") or ()),
            **parts,
        )

    def __str__(self) -> str:
        lines: Lines = [("Key", self.key), ("State", self.state)]
        for face in FACES:
            lines.extend(face.lines(self))
        width = max(len(label) for label, _ in lines) + 2
        return "\n".join(f"{label:<{width}}{text}".rstrip() for label, text in lines)


def _pipeline(client: LockClient) -> Any:
    return cast("Any", client).pipeline(transaction=False)  # untyped on a cluster


def _queue(pipe: Any, queue: Callable[[int, Face], None]) -> list[slice]:
    """Queue each face's reads on ``pipe`` (``queue(index, face)``); where each face's
    replies will be among the pipeline's."""
    spans = []
    for index, face in enumerate(FACES):
        start = len(pipe)
        queue(index, face)
        spans.append(slice(start, len(pipe)))
    return spans


def explain_key(
    client: LockClient,
    key: str,
    options: LockOptions | None = None,
    *,
    task: str | None = None,
    most: int = MOST,
    stack: Stack | None = None,
    weight_error: str | None = None,
) -> Explanation:
    """Read why lock ``key`` blocks (see :class:`Explanation`), on the server's clock.

    ``options`` are the effective lock options of the key's task (its ``lock_limit``,
    ``lock_rate_limit``, leases): without them the key is read as a single lock with no
    rate. ``task`` is the task's name. At most ``most`` waiters, parked calls, handed calls
    and slot holders are listed. Two round trips at most (one when the key has nothing
    but a holder; a Redis Cluster adds one for ``TIME``); a Redis error raises
    ``LockBackendError``. ``stack``: the call's stacked limits (``lock_limits``), each
    read in the second round trip (its keys share the key's hash slot) and listed;
    ``weight_error``: the call's ``lock_weight`` failed (see
    :func:`celery_singleton_lock.explain.weighed_stack`), so ``stack``'s weight is a
    stand-in and the limits are listed without a weight.
    """
    asked = Asked(key, options, stack, most, task=task, weight_error=weight_error)
    cluster = isinstance(client, RedisCluster)
    pipe = _pipeline(client)
    if not cluster:
        pipe.time()
    spans = _queue(pipe, lambda _, face: face.first(asked, pipe))
    now = server_time(client, key) if cluster else (0, 0)
    replies = list(call(key, pipe.execute))
    if not cluster:
        now = time_reply(replies[0])
    asked = dataclasses.replace(asked, now_ms=now[0], now_us=now[1])
    first = [replies[span] for span in spans]
    pipe = _pipeline(client)
    spans = _queue(pipe, lambda index, face: face.second(asked, first[index], pipe))
    more = list(call(key, pipe.execute)) if len(pipe) else []
    parts: dict[str, Any] = {}
    for face, mine, span in zip(FACES, first, spans, strict=True):
        parts.update(face.parts(asked, mine, more[span]))
    explanation = Explanation(key=key, now=round(now[0] / 1000, 3), task=task, **parts)
    states = tuple(state for face in FACES for state in face.state_of(explanation))
    return dataclasses.replace(explanation, states=states)


def conflict_explanation(
    client: LockClient,
    key: str,
    options: LockOptions,
    *,
    task: str | None = None,
    stack: Stack | None = None,
) -> dict[str, Any] | None:
    """The explanation of ``key`` as a plain dict, for a ``TaskLocked`` or a skip record:
    read only when a conflict happened (two round trips at most), and never an error of
    its own (None when Redis could not say)."""
    try:
        return explain_key(
            client, key, options, task=task, most=CONFLICT_MOST, stack=stack
        ).as_json()
    except (LockError, ValueError) as exc:
        log.debug("could not explain why %s is held: %s", key, exc)
        return None
