"""``lock_on_conflict="park"``: waiting that holds no worker.

A run that finds its key held does not block and does not retry: in the same atomic step
that found the key busy, its message (task id, arguments, and the options and headers a
publish needs: queue, priority, retries, links) joins the key's park queue in the lock
Redis, its result state becomes ``PARKED`` (meta: key, position), and the worker moves on.
When the key frees, the release hands it to the first parked call: the key is written for
that call's grant (no newcomer can take it), and the releasing process publishes the call
again under its own task id, so its ``AsyncResult``, retries count and links are the
caller's. In queue scope a ``.delay()`` whose key is held parks at publish: no message
exists until its turn comes. A run over its ``lock_rate_limit`` is published again for
the moment its window frees, its state ``PARKED`` meanwhile.

Nothing is lost and nothing runs twice: a sweep in every worker publishes again a call that
was handed the key but has not started within ``GRANT_RESTART`` seconds (its releasing
process died before publishing it), and hands a free key (its holder died) to the first
parked call; a call published twice from the park queue runs once (its task id is recorded
as finished). A parked call is as durable as the lock Redis: use one with persistence or
replicas.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any, ClassVar

from celery.exceptions import Ignore
from kombu.serialization import dumps, loads

from celery_singleton_lock import _observe as observe
from celery_singleton_lock.engine import atomic
from celery_singleton_lock.engine.wire import call
from celery_singleton_lock.exceptions import LockBackendError, TaskLocked, TaskThrottled
from celery_singleton_lock.modes.base import ACQUIRED, ConflictPolicy, HandedCall
from celery_singleton_lock.modes.policies import WAIT, refuse_in_canvas
from celery_singleton_lock.modes.scope import drop_late_copy, finished, queue_token
from celery_singleton_lock.options import Combination, no_scripts

if TYPE_CHECKING:
    from celery_singleton_lock.engine import Holder, RedisLock
    from celery_singleton_lock.engine.wire import LockClient
    from celery_singleton_lock.modes.base import AnyResult, Publish, Release, Run
    from celery_singleton_lock.options import LockOptions

__all__ = [
    "GRANT_RESTART",
    "HEADER_PARKED",
    "HEADER_TURN",
    "INDEX_KEEP",
    "PARKED",
    "Park",
    "decode_call",
    "parking_index",
    "priority_rank",
    "take_turn",
    "turn_of",
]

log = logging.getLogger("celery_singleton_lock.task")

#: The result state of a parked call (meta: ``key``, ``position``).
PARKED = "PARKED"
#: Header of a message published from the park queue (its value: the key it parked on).
HEADER_PARKED = "singleton_lock_parked"
#: Header of a call's turn in its key's line (``lock_order="enqueue"``, taken at publish).
HEADER_TURN = "singleton_lock_turn"
#: Seconds a call handed the key may take to start before a sweep publishes it again (its
#: releasing process died, or lost the reply, before publishing it; a copy that comes
#: after the first started runs once).
GRANT_RESTART = 15.0
#: How often a run that finds its key held and then free again tries to park or take it
#: before it comes back through the broker.
PARK_TRIES = 4
#: A process names a key in the sweep's list again after this many seconds, and the sweep
#: keeps a name at least ``INDEX_KEEP`` seconds (so no park goes unnamed in between).
INDEX_REFRESH = 5.0
INDEX_KEEP = 30
_INDEXED_MOST = 10_000
_indexed: dict[str, float] = {}
#: A park queue outlives its last change by at least this much (seconds).
MIN_KEEP = 86_400.0


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def parking_index(prefix: str) -> str:
    """The sorted set of lock keys with parked calls, which the sweep goes through (in a
    hash slot of its own, named after the prefix)."""
    return f"{{{prefix}}}~parking"


def encode_call(task_name: str, call: HandedCall, *, key: str, serializer: str) -> bytes:
    """A call as the park queue keeps it: what publishing it again needs. Its headers name
    the key it parked on."""
    options = {name: value for name, value in call.options.items() if name != "task_id"}
    options["headers"] = {**(options.get("headers") or {}), HEADER_PARKED: key}
    content_type, encoding, body = dumps(
        [list(call.args), dict(call.kwargs)], serializer=serializer
    )
    data = body if isinstance(body, bytes) else str(body).encode()
    head = "\n".join((task_name, content_type, encoding, json.dumps(options, default=str)))
    return head.encode() + b"\n" + data


def decode_call(task_id: str, payload: bytes) -> tuple[str, HandedCall]:
    """(task name, the call) of a parked call handed its key."""
    task_name, content_type, encoding, options, body = payload.split(b"\n", 4)
    args, kwargs = loads(
        body, content_type.decode(), encoding.decode(), accept={content_type.decode()}
    )
    return task_name.decode(), HandedCall(task_id, tuple(args), dict(kwargs), json.loads(options))


def _keep_ms(options: LockOptions) -> int:
    return _ms(max(options.queue_timeout, MIN_KEEP))


def _mark_parked(task: Any, task_id: str, key: str, position: int) -> None:
    """Store ``PARKED`` (meta: key and position) for ``task_id``, so Flower and
    ``AsyncResult.state`` show it; nothing to store without a result backend."""
    try:
        task.backend.store_result(task_id, {"key": key, "position": position}, PARKED)
    except Exception:
        log.debug("could not store PARKED for %s", task_id, exc_info=True)


def _index(client: LockClient, prefix: str, key: str, task_name: str) -> None:
    """Name ``key`` (and its task) in the sweep's list before anything parks there (so a
    crash between the two leaves at most a name the sweep drops), scored by the server's
    second. A process names a key again only after ``INDEX_REFRESH`` seconds: the sweep
    keeps a name younger than ``INDEX_KEEP``, parked calls or not."""
    member = f"{task_name}\n{key}"
    now = time.monotonic()
    if now - _indexed.get(member, -INDEX_REFRESH) < INDEX_REFRESH:
        return
    seconds, _ = (int(part) for part in call(key, client.time))
    call(key, client.zadd, parking_index(prefix), {member: seconds})
    if len(_indexed) >= _INDEXED_MOST:
        _indexed.clear()
    _indexed[member] = now


class Park(ConflictPolicy):
    """Park a run (or, in queue scope, a call) whose key is held; hand the key to the first
    parked call when it frees."""

    name = reported = "park"
    rules: ClassVar[tuple[Combination, ...]] = (
        Combination(
            lambda o, s: o.on_conflict == "park" and no_scripts(s),
            "lock_on_conflict='park' needs Lua scripts (a call parks in the same atomic step "
            "that finds its key held), which singleton_lock_scripting=False turns off",
        ),
        Combination(
            lambda o, _: o.on_conflict == "park" and o.debounce is not None,
            "lock_on_conflict='park' cannot be combined with lock_debounce (a burst already "
            "runs once, after its last call)",
        ),
    )

    @classmethod
    def applies(cls, options: LockOptions) -> bool:
        return options.on_conflict == cls.name

    def claim(self, task_id: str, options: LockOptions) -> str | None:
        """A call handed the key from the park queue holds it under its grant, a token
        derived from its task id: its run takes that hold over."""
        return queue_token(task_id, options.limit)

    def finished_keep(self, options: LockOptions) -> float | None:
        return options.queue_timeout  # a call published twice from the park queue runs once

    # -- a run ---------------------------------------------------------------------------

    def acquire(self, run: Run) -> bool:
        if run.eager:  # no worker to come back to: wait for the key, as "wait" does
            return WAIT.acquire(run)
        return run.lock.acquire(blocking=False)

    def admit(self, run: Run) -> bool:
        """A call handed the key from the park queue starts: the sweep lets it be. A copy
        of a handed call that finished already (published twice by the sweep) does not
        run again."""
        if not run.header(HEADER_PARKED):
            return True
        if atomic.park_started(run.client, run.key, run.task_id):
            observe.unparked(run.task, run.key, run.task_id, scope=run.options.scope)
        elif finished(run.lock, run.task_id):
            run.give_back()
            drop_late_copy(run, "a copy of a parked call that finished")
        return True

    def conflict(self, run: Run, holder: Holder | None) -> Any:
        if run.eager:
            raise TaskLocked(run.key, holder.task_id if holder else None)
        turn = turn_of(run)
        for _ in range(PARK_TRIES):
            if self.park_run(run, turn):
                raise Ignore
            # The key freed between the try and the park (nobody parked before the run):
            # take it here rather than through the broker.
            if run.lock.acquire(blocking=False):
                return ACQUIRED
        raise run.retry(TaskLocked(run.key, None), 0.0, counted=False)

    def park_run(self, run: Run, turn: int | None) -> bool:
        """Park the delivered call ``run`` at ``turn`` (None: its arrival) and report it;
        publish the call handed the key meanwhile, if any. False when the key is free and
        nobody is parked before the call: it takes the key as usual."""
        sig = run.task.signature_from_request(run.request)
        call = HandedCall(
            run.task_id, tuple(sig.args or ()), dict(sig.kwargs or {}), dict(sig.options)
        )
        payload = encode_call(run.task.name, call, key=run.key, serializer=run.serializer)
        parked = self._park(
            run.client,
            run.key,
            prefix=run.settings.prefix,
            task_id=run.task_id,
            options=run.options,
            payload=payload,
            turn=turn,
        )
        if parked.handed is not None:
            self._publish(run, parked.handed)
        if parked.position is None:
            return False
        self._parked(run.task, run.key, run.task_id, parked.position, run.options.scope)
        return True

    def throttled(self, run: Run, retry_in: float) -> bool:
        """A throttled run is published again for the moment its window frees, and shows
        ``PARKED`` meanwhile (its worker does not wait for it)."""
        if run.eager:
            return WAIT.throttled(run, retry_in)
        run.scope.hand_back(run)
        run.retry(TaskThrottled(run.key, retry_in), retry_in, counted=False)
        self._parked(run.task, run.key, run.task_id, 0, run.options.scope)
        raise Ignore

    def release(self, ending: Release, state: str | None) -> bool:
        """Hand the key to the first parked call, or release it, in one atomic step."""
        lock = ending.lock
        try:
            outcome = atomic.park_release(
                lock,
                _ms(ending.options.queue_timeout),
                ending.record,
                ordered=ending.task_id if ending.options.order == "enqueue" else None,
            )
        except LockBackendError as exc:
            log.error("could not hand %s to its parked calls: %s", lock.name, exc)
            return False
        lock.detach()
        ending.released(state, held=outcome != 0)
        if isinstance(outcome, atomic.ParkedCall):
            self._publish(ending, outcome)
        return True

    # -- a call (queue scope) --------------------------------------------------------------

    def publish_conflict(self, call: Publish, lock: RedisLock) -> AnyResult:
        """A ``.delay()`` whose key is held parks: no message exists until its turn."""
        key, task_id = lock.name, call.task_id
        refuse_in_canvas(call, key, None, "its key is held (a parked call is published later)")
        this = HandedCall(task_id, call.args, call.kwargs, call.publish_options)
        payload = encode_call(call.task.name, this, key=key, serializer=call.serializer)
        turn = (call.publish_options.get("headers") or {}).get(HEADER_TURN)
        for _ in range(4):
            parked = self._park(
                call.client,
                key,
                prefix=call.prefix,
                task_id=task_id,
                options=call.options,
                payload=payload,
                turn=None if turn is None else int(turn),
            )
            if parked.handed is not None:
                self._publish(call, parked.handed)
            if parked.position is not None:
                self._parked(call.task, key, task_id, parked.position, "queue")
                return call.result(task_id)
            if lock.acquire(blocking=False):
                return call.send_locked(lock, task_id)
        raise TaskLocked(key, None, f"lock {key!r} kept changing hands; park gave up")

    # -- shared ----------------------------------------------------------------------------

    def _park(
        self,
        client: LockClient,
        key: str,
        *,
        prefix: str,
        task_id: str,
        options: LockOptions,
        payload: bytes,
        turn: int | None,
    ) -> atomic.Parked:
        token = queue_token(task_id, options.limit)
        task_name = _task_of(payload)
        info = json.dumps(
            {"task_id": task_id, "task": task_name, "queued": True, "parked": True},
            sort_keys=True,
            separators=(",", ":"),
        )
        _index(client, prefix, key, task_name)
        return atomic.park(
            client,
            key,
            task_id,
            turn=turn,
            token=token,
            info=info,
            payload=payload,
            keep_ms=_keep_ms(options),
            grant_ms=_ms(options.queue_timeout),
            slots=options.limit,
            ordered=options.order == "enqueue",
        )

    def _parked(self, task: Any, key: str, task_id: str, position: int, scope: str) -> None:
        _mark_parked(task, task_id, key, position)
        observe.parked(task, key, task_id, position=position, scope=scope)
        log.info("%s[%s] parked on %s (position %s)", task.name, task_id, key, position)

    def _publish(self, where: Release | Publish | Run, handed: atomic.ParkedCall) -> None:
        """Publish a parked call that was just handed the key, past the lock."""
        where.publish_past_lock(decode_call(handed.task_id, handed.payload)[1])


def priority_rank(app: Any, priority: Any) -> int:
    """Where a Celery ``priority`` puts a call in its key's line (0 first, 255 last), read as
    the app's broker reads it: on Redis 0 is the highest priority, on AMQP 255 is; no
    priority is 0 to both brokers."""
    try:
        number = min(255, max(0, int(priority or 0)))
    except (TypeError, ValueError):
        number = 0
    url = str(app.conf.broker_url or "")
    lowest_first = url.split("://", 1)[0].split("+", 1)[0] in {"redis", "rediss", "sentinel"}
    return number if lowest_first else 255 - number


def take_turn(
    client: LockClient, key: str, task_id: str, *, rank: int, options: LockOptions
) -> int:
    """The turn of call ``task_id`` in the line of ``key``: taken now at the back of its
    rank, or the one it has."""
    return atomic.order_take(client, key, task_id, rank=rank, keep_ms=_ms(options.queue_timeout))


def turn_of(run: Run) -> int | None:
    """The turn of a delivered call in its key's line: from its message, else taken now
    (it was published with a countdown or ETA, or not through ``apply_async``); None when
    its key's calls run in arrival order."""
    if run.options.order != "enqueue":
        return None
    carried = run.header(HEADER_TURN)
    if carried is not None:
        return int(carried)
    delivery = getattr(run.request, "delivery_info", None) or {}
    rank = priority_rank(run.task.app, delivery.get("priority"))
    return take_turn(run.client, run.key, run.task_id, rank=rank, options=run.options)


def _task_of(payload: bytes) -> str:
    return payload.split(b"\n", 1)[0].decode("utf-8", "replace")
