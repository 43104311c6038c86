"""``lock_on_conflict="park"``: waiting that holds no worker.

A run that finds its key held does not block and does not retry: in the same atomic step
that found the key busy, its message (task id, arguments, and the options and headers a
publish needs: queue, priority, retries, links) joins the key's park queue in the lock
Redis, its result state becomes ``PARKED`` (meta: key, position), and the worker moves on.
When the key frees, the release hands it to the first parked call: the key is written for
that call's grant (no newcomer can take it), and the releasing process publishes the call
again under its own task id, so its ``AsyncResult``, retries count and links are the
caller's. In queue scope a ``.delay()`` whose key is held parks at publish: no message
exists until its turn comes. A run whose key is free but whose stacked limits
(``lock_limits``) have no room, and a run over its ``lock_rate_limit``, are held back in the
lock Redis too (:mod:`.held`), state ``PARKED``, and published again once their limits have
room or their window opens.

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
from typing import TYPE_CHECKING, Any, ClassVar

from celery.exceptions import Ignore

from celery_singleton_lock import _observe as observe
from celery_singleton_lock.engine import atomic
from celery_singleton_lock.exceptions import LockBackendError, TaskLocked
from celery_singleton_lock.modes.base import ACQUIRED, ConflictPolicy, HandedCall, Swept
from celery_singleton_lock.modes.held import hold_back
from celery_singleton_lock.modes.parking import (
    HEADER_HELD,
    HEADER_PARKED,
    HEADER_TURN,
    INDEX_KEEP,
    PARKED,
    decode_call,
    encode_call,
    index_key,
    keep_ms,
    leave_held,
    mark_parked,
    milliseconds,
    ordered,
    parking_index,
    priority_rank,
    take_turn,
    task_of,
    turn_of,
)
from celery_singleton_lock.modes.policies import WAIT, locked, refuse_in_canvas
from celery_singleton_lock.modes.scope import drop_late_copy, finished, queue_owner, queue_token
from celery_singleton_lock.options import Combination, no_scripts

if TYPE_CHECKING:
    from celery_singleton_lock.engine import Holder, RedisLock
    from celery_singleton_lock.engine.wire import LockClient
    from celery_singleton_lock.modes.base import AnyResult, Publish, Release, Run, Scope
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

#: Seconds a call handed the key may take to start before a sweep publishes it again (its
#: releasing process died, or lost the reply, before publishing it; a copy that comes
#: after the first started runs once).
GRANT_RESTART = 15.0
#: The most calls one sweep of a key publishes again.
SWEEP_CALLS = 100
#: How often a run that finds its key held and then free again tries to park or take it
#: before it comes back through the broker.
PARK_TRIES = 4


class Park(ConflictPolicy):
    """Park a run (or, in queue scope, a call) whose key is held; hand the key to the first
    parked call when it frees."""

    name = reported = "park"
    keeps_calls = True
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

    def limited_comes_back(self, scope: Scope) -> str | None:
        return self.reported  # parked, in either scope, until its limits have room

    def claim(self, task_id: str, options: LockOptions) -> str | None:
        """A call handed the key from the park queue holds it under its grant, a token
        derived from its task id: its run takes that hold over."""
        return queue_token(task_id, options.limit)

    def finished_keep(self, options: LockOptions) -> float | None:
        return options.queue_timeout  # a call published twice from the park queue runs once

    def sweep(self, client: LockClient, key: str, options: LockOptions) -> Swept:
        """A call handed the key but not started within ``GRANT_RESTART`` is handed out
        again; a free key goes to the first parked call (see :mod:`.runtime.sweep`)."""
        active, calls = atomic.park_sweep(
            client,
            key,
            restart_ms=milliseconds(GRANT_RESTART),
            grant_ms=milliseconds(options.queue_timeout),
            most=SWEEP_CALLS,
            slots=options.limit,
            ordered=ordered(options),
        )
        return Swept(active, [decode_call(handed.task_id, handed.payload)[1] for handed in calls])

    # -- a run ---------------------------------------------------------------------------

    def acquire(self, run: Run) -> bool:
        if run.eager:  # no worker to come back to: wait for the key, as "wait" does
            return WAIT.acquire(run)
        return run.lock.acquire(blocking=False)

    def admit(self, run: Run) -> bool:
        """A call handed the key from the park queue starts: the sweep lets it be. A copy
        of a handed call that finished already (published twice by the sweep, or another
        copy of its message took the grant and ran first) does not run again; nor does a
        call of a task with stacked limits, or one held back by its limits or its rate
        (published again from the lock Redis), whose other copy ran meanwhile."""
        if not run.header(HEADER_PARKED):
            held = run.header(HEADER_HELD) is not None
            if (held or run.lock.stack is not None) and finished(run.lock, run.task_id):
                run.give_back()
                drop_late_copy(run, "a copy of a call that finished")
            if held:
                observe.unparked(run.task, run.key, run.task_id, scope=run.options.scope)
            return True
        started = atomic.park_started(run.client, run.key, run.task_id)
        if started < 0:
            run.give_back()
            drop_late_copy(run, "a copy of a parked call that finished")
        if started:
            observe.unparked(run.task, run.key, run.task_id, scope=run.options.scope)
        return True

    def conflict(self, run: Run, holder: Holder | None) -> Any:
        if run.eager:
            raise TaskLocked(run.key, holder.task_id if holder else None)
        if run.header(HEADER_PARKED) and finished(run.lock, run.task_id):
            # Another copy of this message (the same task id) took the grant and ran before
            # the handed copy came: parking it again would run the call twice.
            drop_late_copy(run, "a copy of a parked call that finished")
        turn = turn_of(run)
        for _ in range(PARK_TRIES):
            if self.park_run(run, turn):
                raise Ignore
            # The key freed between the try and the park (nobody parked before the run):
            # take it here rather than through the broker.
            if run.lock.acquire(blocking=False):
                return ACQUIRED
        self._left_held(run)  # the message published now carries the call
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
        self._left_held(run)  # the key's park queue has it now
        self._parked(run.task, run.key, run.task_id, parked.position, run.options.scope)
        return True

    def limited(self, run: Run) -> bool:
        """A run that a stacked limit held back waits in the lock Redis until its limits
        have room (``modes.held``) and shows ``PARKED`` meanwhile, holding no share and no
        worker; its place in the line of each limit that held it back is kept, so lighter
        calls do not pass it. A key handed to it from the park queue goes on to the next
        parked call (a call of another weight may fit); in queue scope the call's hold
        stays with its message. When its limits had room after all it is published again
        at once."""
        if run.eager:
            return False  # no worker to come back to: the caller is told (TaskLocked)
        if run.header(HEADER_PARKED):
            # not the sweep's to publish again any more; a copy of a call that finished
            # meanwhile (another copy of its message ran) does not come back, and the key
            # handed to it goes on to the next parked call
            if atomic.park_started(run.client, run.key, run.task_id) < 0:
                self._hand_on(run)
                drop_late_copy(run, "a copy of a parked call that finished")
        elif finished(run.lock, run.task_id):
            self._hand_on(run)
            drop_late_copy(run, "a copy of a call that finished")
        kept = hold_back(run)
        if run.scope.at_publish:
            run.scope.hand_back(run)
        else:
            self._hand_on(run)
        if not kept:  # its limits have room now: it comes back at once
            run.retry(locked(run, None, None), 0.0, counted=False)
        self._parked(run.task, run.key, run.task_id, 0, run.options.scope)
        raise Ignore

    def _hand_on(self, run: Run) -> None:
        """The key held for ``run``'s call (a grant from the park queue) goes to the next
        parked call, or is released; nothing when it holds none."""
        try:
            outcome = atomic.park_release(queue_owner(run), milliseconds(run.options.queue_timeout))
        except LockBackendError as exc:
            log.error("could not hand %s on to its parked calls: %s", run.key, exc)
            return
        if isinstance(outcome, atomic.ParkedCall):
            self._publish(run, outcome)

    def _left_held(self, run: Run) -> None:
        """A call published again from the held calls waits elsewhere now: the sweep of the
        held calls lets it be (an error is logged; a copy it hands out runs once)."""
        if run.header(HEADER_HELD) is None:
            return
        try:
            leave_held(run)
        except LockBackendError as exc:
            log.warning("could not clear %s from the held calls: %s", run.task_id, exc)

    def throttled(self, run: Run, retry_in: float) -> bool:
        """A throttled run gives its key back and waits in the lock Redis until its window
        opens (``modes.held``), showing ``PARKED`` meanwhile: its worker does not keep it."""
        if run.eager:
            return WAIT.throttled(run, retry_in)
        run.scope.hand_back(run)
        hold_back(run, due=retry_in)
        self._parked(run.task, run.key, run.task_id, 0, run.options.scope)
        raise Ignore

    def release(self, ending: Release, state: str | None) -> bool:
        """Hand the key to the first parked call, or release it, in one atomic step."""
        lock = ending.lock
        try:
            outcome = atomic.park_release(
                lock,
                milliseconds(ending.options.queue_timeout),
                ending.record,
                ordered=ending.task_id if ordered(ending.options) else None,
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
        task_name = task_of(payload)
        info = json.dumps(
            {"task_id": task_id, "task": task_name, "queued": True, "parked": True},
            sort_keys=True,
            separators=(",", ":"),
        )
        index_key(client, prefix, key, task_name)
        return atomic.park(
            client,
            key,
            task_id,
            turn=turn,
            token=token,
            info=info,
            payload=payload,
            keep_ms=keep_ms(options),
            grant_ms=milliseconds(options.queue_timeout),
            slots=options.limit,
            ordered=ordered(options),
        )

    def _parked(self, task: Any, key: str, task_id: str, position: int, scope: str) -> None:
        mark_parked(task, task_id, key, position)
        observe.parked(task, key, task_id, position=position, scope=scope)
        log.info("%s[%s] parked on %s (position %s)", task.name, task_id, key, position)

    def _publish(self, where: Release | Publish | Run, handed: atomic.ParkedCall) -> None:
        """Publish a parked call that was just handed the key, past the lock."""
        where.publish_past_lock(decode_call(handed.task_id, handed.payload)[1])
