"""What a mode is, and what it may see of a run or a call: the contract between the
pipelines of :mod:`celery_singleton_lock.runtime` and the modes.

The run pipeline calls, for one delivery of a message, in this order: ``deliver`` (before
the lock is tried), the conflict policy's ``acquire`` and, when the key stays held, its
``conflict``; then ``admit`` (the run holds its key: may it start?), ``start`` (the body is
about to run), and ``release`` when the run ends. The publish pipeline calls
``before_publish`` and, for a queue-scope call whose key is held, the policy's
``publish_conflict``. Every hook has a default that does nothing, so a mode implements only
the phases it changes. A mode sees the run through :class:`Run` and the call through
:class:`Publish`; the runtime's objects satisfy these protocols, and modes import nothing
from the runtime.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Protocol

if TYPE_CHECKING:
    from celery.result import AsyncResult

    from celery_singleton_lock._observe import RunLock
    from celery_singleton_lock.engine import Holder, RedisLock
    from celery_singleton_lock.engine.atomic import Record
    from celery_singleton_lock.engine.wire import LockClient
    from celery_singleton_lock.options import Combination, LockOptions, Settings

    AnyResult = AsyncResult[Any]

__all__ = [
    "ACQUIRED",
    "ConflictPolicy",
    "HandedCall",
    "Mode",
    "Publish",
    "Release",
    "Run",
    "Scope",
    "Swept",
]


class _Acquired:
    """What ``ConflictPolicy.conflict`` returns when it took the key for the run."""

    def __repr__(self) -> str:
        return "ACQUIRED"


#: A conflict policy took the key for the run after all: the run goes on.
ACQUIRED = _Acquired()


class HandedCall(NamedTuple):
    """A call of a task that was just handed its key (a follow-up, a parked call): published
    again under its own task id, past the lock."""

    task_id: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    options: dict[str, Any]


class Swept(NamedTuple):
    """What a worker sweep of one key found: whether calls are still set aside there (else
    the key leaves the sweep's list), and the calls just handed the key, to publish."""

    active: bool
    calls: Sequence[HandedCall]


class Release(Protocol):
    """A hold that is being given up: at the end of a run, or for a run that was lost (its
    process died, or it was revoked) by the process that noticed."""

    @property
    def task(self) -> Any: ...
    @property
    def task_id(self) -> str: ...
    @property
    def lock(self) -> RedisLock: ...
    @property
    def options(self) -> LockOptions: ...
    @property
    def record(self) -> Record | None:
        """What the release writes in the same step (queue scope: who finished), or None."""

    @property
    def blocking(self) -> bool:
        """Whether the release may hold up its thread while Redis errs: a run's own thread
        may; the worker's main process, releasing for a lost run, serves the consumer."""

    def publish_past_lock(self, call: HandedCall) -> None:
        """Publish a call of this task that was just handed the key (a follow-up, a parked
        call) under its own task id, past the lock."""

    def released(self, state: str | None, *, held: bool, hold: float = 0.0) -> None:
        """Report how the hold ended: ``held`` False when the lease was found lost (the key
        was no longer ours); ``hold``: seconds the key stays held after a success."""


class Run(Release, Protocol):
    """One delivery of a message of a locked task, from its first try of the lock."""

    @property
    def request(self) -> Any: ...
    @property
    def key(self) -> str: ...
    @property
    def lock(self) -> RunLock: ...
    @property
    def settings(self) -> Settings: ...
    @property
    def client(self) -> LockClient: ...
    @property
    def policy(self) -> ConflictPolicy:
        """The conflict policy this attempt applies (see :meth:`ConflictPolicy.for_attempt`)."""

    @property
    def scope(self) -> Scope: ...
    @property
    def started(self) -> float:
        """``time.monotonic()`` when the run first tried its lock."""

    @property
    def retries(self) -> int: ...
    @property
    def eager(self) -> bool: ...
    @property
    def serializer(self) -> str:
        """The task's message serializer."""

    def header(self, name: str) -> Any:
        """A header of the delivered message (None when absent)."""

    def insist(self) -> None:
        """This delivery is the work itself and must not be dropped as a duplicate: under
        ``skip`` a busy key makes it come back later (as for a retried run)."""

    def countdown(self, holder: Holder | None) -> float:
        """When a run that found its key busy (held by ``holder``) comes back."""

    def retry(
        self,
        exc: BaseException,
        countdown: float,
        *,
        counted: bool = True,
        duplicate: bool = False,
    ) -> BaseException:
        """The ``Retry`` to raise for a retry the lock asks for: published past the queue
        lock, carrying this run's key and options. ``counted=False``: it does not count
        against the task's ``max_retries``. ``duplicate``: an earlier delivery of this
        message held the key, so the retried run checks that it did not finish the work."""

    def carried_headers(self) -> dict[str, Any]:
        """The headers a message published again for this call by the lock carries (its
        per-call options, its turn, the lock's retries count, one more)."""

    def outage(self, exc: BaseException, *, going_on: str = "running UNLOCKED") -> None:
        """The lock Redis failed (``exc``): give back what the run holds and raise the retry
        that waits for Redis; or, when ``singleton_lock_fail_open`` is set, log that the run
        goes on (``going_on``) and return."""

    def give_back(self) -> None:
        """Release the run's hold now (owner-checked; a failure is logged, not raised)."""

    def queued_lock(self) -> RedisLock:
        """The lock of this run's message, claiming the run's hold (queue scope)."""


class Publish(Protocol):
    """One ``apply_async`` of a locked task, after its ``lock_*`` options were taken out."""

    @property
    def task(self) -> Any: ...
    @property
    def args(self) -> tuple[Any, ...]: ...
    @property
    def kwargs(self) -> dict[str, Any]: ...
    @property
    def options(self) -> LockOptions: ...
    @property
    def publish_options(self) -> dict[str, Any]:
        """What goes to Celery's ``apply_async`` (routing, countdown, headers ...)."""

    @property
    def client(self) -> LockClient: ...
    @property
    def serializer(self) -> str: ...
    @property
    def task_id(self) -> str: ...

    def key(self) -> str:
        """The lock key of this call's arguments (as the worker will compute it)."""

    def send(self, *, task_id: str | None = None, keyed: bool = False, **extra: Any) -> AnyResult:
        """Publish without a queue lock (``extra`` overrides publish options; ``headers`` in
        it are added to the call's own); ``keyed``: the message carries this call's key."""

    def send_locked(self, lock: RedisLock, task_id: str) -> AnyResult:
        """Publish a call whose queue lock ``lock`` holds; a failed publish frees it."""

    def queue_lock(self, task_id: str) -> RedisLock:
        """The queue lock a publish of ``task_id`` takes (a token derived from the id)."""

    def result(self, task_id: str) -> AnyResult: ...
    @property
    def prefix(self) -> str:
        """``singleton_lock_prefix``."""

    def publish_past_lock(self, call: HandedCall) -> None:
        """Publish a call of this task that was just handed the key, past the lock."""


class Mode:
    """Behaviour that some options switch on. Subclasses override the hooks of the phases
    they change; ``rules`` are the option combinations they refuse (checked at worker start
    and on every call with per-call options)."""

    #: The option values this mode stands for (its docs and registry name).
    name: ClassVar[str] = ""
    rules: ClassVar[tuple[Combination, ...]] = ()

    # What observers (otel, metrics, the CLI) ask of a policy or mode that settles a
    # conflict, rather than comparing its name: see ``modes.REPORTED``.
    #: The ``policy`` the lock's signals report when it settles a conflict ("": none).
    reported: ClassVar[str] = ""
    #: The ``lock.outcome`` of an attempt it settles at once; None when a signal of its
    #: own ends the attempt (``lock_parked``, ``lock_coalesced``, ``lock_superseded``).
    outcome: ClassVar[str | None] = None
    #: Whether a run that meets it blocks (for its key, or for its rate) instead of ending.
    waits: ClassVar[bool] = False
    #: Whether it fails the caller (``TaskLocked``, ``TaskThrottled``) when the call cannot
    #: have its key or its start.
    fails_caller: ClassVar[bool] = False

    @classmethod
    def applies(cls, options: LockOptions) -> bool:
        """Whether a task with these effective options uses this mode."""
        return False

    def claim(self, task_id: str, options: LockOptions) -> str | None:
        """The owner token whose hold a delivery of ``task_id`` takes over, if any (a hold
        taken for it at publish, or handed to it while it was parked)."""
        return None

    def worker_problem(self, options: LockOptions, pool: type | None) -> str | None:
        """Why a worker running tasks with these options on this pool class (None when
        unknown) must not start, or None. Checked when the worker starts."""
        return None

    # -- the run pipeline, in order ---------------------------------------------------------

    def deliver(self, run: Run) -> None:
        """A message was delivered; the lock is not tried yet. Raise ``Ignore`` to end the
        delivery without running it."""

    def admit(self, run: Run) -> bool:
        """The run holds its key: False ends it without running the body (the mode gave
        the key back or dealt with it). May raise (a retry, an error)."""
        return True

    def start(self, run: Run) -> bool:
        """The body is about to run: False when the run no longer holds the key from here on
        (nothing is released at its end)."""
        return True

    def guard(self, run: Run) -> contextlib.AbstractContextManager[None]:
        """What the body runs inside, as the holder (the mode watches over it)."""
        return contextlib.nullcontext()

    def release(self, ending: Release, state: str | None) -> bool:
        """The hold is being given up (``state``: how the run ended, None for a lost run):
        True when the mode dealt with the key itself (handed it on, kept it)."""
        return False

    def forget(self, client: LockClient, key: str, task_id: str) -> None:
        """A call of ``key`` that is not running (its message lost, dropped or revoked, no
        hold of it left) will never run: drop what the mode keeps for it in the lock Redis."""

    def finished_keep(self, options: LockOptions) -> float | None:
        """Seconds a finished run's task id must be remembered beside its key (so a late
        copy of its message, or of its burst, does not run again); None: not needed."""
        return None

    def busy_countdown(self, run: Run, countdown: float) -> float:
        """The countdown of a retry because the key is busy, as this mode would have it
        (``countdown``: what the policy chose)."""
        return countdown

    # -- the publish pipeline ---------------------------------------------------------------

    def before_publish(self, call: Publish) -> AnyResult | None:
        """A call is being published: the result when the mode published it (or decided
        that nothing is published), None to go on."""
        return None


class Scope(Mode):
    """When the lock is taken: at the start of a run, or at publish (held from enqueue)."""

    #: Whether a publish takes the lock (and a duplicate call publishes nothing).
    at_publish: ClassVar[bool] = False
    #: Whether a delivery's try of the lock first checks, in the same step, that the run
    #: of its task id has not finished already (a late copy of its message).
    drops_finished: ClassVar[bool] = False

    def carried_key(self, run_key: str | None) -> str | None:
        """The key a run locks when its message carries one (``run_key``), else None."""
        return None

    def retried(self, ending: Release) -> bool:
        """The run ended in a retry: True when the retried message took its hold over."""
        return False

    def hand_back(self, run: Run) -> None:
        """A run gives its key back before starting, to come again later."""
        run.give_back()

    def finished_copy(self, run: Run) -> Any:
        """The run's try of the lock found that its task id's run finished already
        (``drops_finished``) and took nothing: end this delivery (or raise)."""
        raise NotImplementedError


class ConflictPolicy(Mode):
    """What a run or a queue-scope call does when its key is held (``lock_on_conflict``)."""

    #: Whether calls it sets aside live only in the lock Redis (so workers sweep for them,
    #: and ``locks check`` asks for a lock Redis that keeps its data).
    keeps_calls: ClassVar[bool] = False

    def sweep(self, client: LockClient, key: str, options: LockOptions) -> Swept:
        """A worker sweep of ``key`` (a policy that ``keeps_calls``): hand calls that would
        otherwise be lost the key."""
        return Swept(False, ())

    def for_attempt(self, retried: bool) -> ConflictPolicy:
        """The policy of an attempt that is the work itself (``retried``: a retry, or a run
        that a mode says must not be dropped) rather than maybe a duplicate of it."""
        return self

    def acquire(self, run: Run) -> bool:
        """Take the run's lock: a single try unless the policy waits."""
        return run.lock.acquire(blocking=False)

    def conflict(self, run: Run, holder: Holder | None) -> Any:
        """The key stayed held by ``holder``: the run's result, or raise; or ``ACQUIRED``
        when the policy took the key for the run after all (it freed meanwhile): the run
        goes on as if its first try had taken it."""
        raise NotImplementedError

    def limited_comes_back(self, scope: Scope) -> str | None:
        """A stacked limit had no room for a run whose key was free: the policy reported
        (``lock_conflict``) when the call comes back later as another delivery rather than
        meet this policy now, else None. A queue-scope call was accepted when it was
        published (its duplicates were given its result), so it comes back; a run-scope
        run meets the policy."""
        return "retry" if scope.at_publish else None

    def limited(self, run: Run) -> bool:
        """A stacked limit held the run back, and the call will come back as another
        delivery (kept in the lock Redis until it fits, its place in the limit's line kept
        meanwhile: see :mod:`.held`): True when the policy has sent it on its way itself
        (or raise); False to let the runtime set it aside."""
        return False

    def throttled(self, run: Run, retry_in: float) -> bool:
        """The run holds its key but its start rate is used up (the next start is free in
        ``retry_in`` seconds): True to look again (the mode waited), False to skip; or
        raise. The key is given back unless True is returned."""
        raise NotImplementedError

    def publish_conflict(self, call: Publish, lock: RedisLock) -> AnyResult:
        """A queue-scope call found its key held (``lock`` tried it): the result the caller
        gets, or raise."""
        raise NotImplementedError
