"""The modes under test: one locked task per mode, and what each promises about a call.

Every task has the same signature, ``(key, n, seconds, fail=False)``: ``key`` is the lock
key (``lock_keys=["key"]``), ``n`` the number of the call (unique in a run, so a body tells
which call's arguments it runs), ``seconds`` how long the body runs, and ``fail`` makes the
body raise after it ran (a failed run: under ``lock_release="success"`` it must not hold).

:func:`register` defines the tasks on an app (the invariant runner's and the soak's), with
a body function supplied by the caller (:mod:`tests.invariants.recording`).

A call's *terminal state* is one of :data:`TERMINALS`; each mode lists those it allows.

The stacked modes (``stack_*``) describe their ``lock_limits`` and ``lock_weight`` in the
:class:`Mode` itself (``limits``, ``weight``; :data:`STACK` and :func:`stack_weight`), and
the checker reads them from there to prove no limit is ever exceeded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, cast

from celery_singleton_lock import LockedTask

if TYPE_CHECKING:
    from celery import Celery, Task

    AnyTask = Task[Any, Any]
else:
    AnyTask = Any

__all__ = [
    "DEBOUNCE",
    "HOLD",
    "MAX_WAIT",
    "MODES",
    "RATE",
    "STACK",
    "TERMINALS",
    "Body",
    "Mode",
    "register",
    "stack_weight",
    "task_name",
]

#: Every terminal state a call can end in, and what it means.
TERMINALS: Mapping[str, str] = MappingProxyType(
    {
        "ran": "its body ran with its arguments and the result is the body's",
        "failed": "its body ran with its arguments and raised (a call made with fail=True)",
        "skipped": "it ended without running, with a skip record (skip_info) naming the holder",
        "raised": "it ended FAILURE with TaskLocked (policy raise, or wait past lock_wait)",
        "refused": "apply_async raised (TaskLocked or LockBackendError): the caller was told",
        "deduplicated": "apply_async returned the AsyncResult of the call queued before it",
        "coalesced": "it became (or joined) the key's follow-up, which ran with the latest args",
        "debounced": "it joined a burst whose run had the burst's last arguments",
        "superseded": "a later call replaced it: REVOKED, lock_superseded names that call",
        "result_lost": "its body ran once, but its worker died before storing the result: "
        "a later copy of its message stored FAILURE ResultLost instead of running it again",
    }
)

#: ``lock_hold`` of the success-hold modes (seconds).
HOLD = 1.0
#: ``lock_rate_limit`` of the throttled modes.
RATE = "2/s"
RATE_PARSED = (2, 1.0)
#: ``lock_debounce`` / ``lock_debounce_max_wait`` of the debounced modes (seconds).
DEBOUNCE = 0.6
MAX_WAIT = 1.5
#: ``lock_wait`` of the waiting modes: far beyond any scenario's backlog.
LOCK_WAIT = 60.0
#: ``lock_retry_delay`` of the retrying modes.
RETRY_DELAY = 0.3
#: ``lock_limits`` of the stacked modes: weight 3 per key name and 4 in all. The templates
#: render from the call's arguments, and a limit's name is shared by every task of the app
#: (one stack per ``singleton_lock_prefix``): ``grp:k0`` is one budget for key ``k0`` of
#: every stacked mode of a scenario (several lock keys, as each task's lock key differs),
#: ``global`` one budget for all of their runs.
STACK: tuple[tuple[str, int], ...] = (("grp:{key}", 3), ("global", 4))


def stack_weight(key: str, n: int, seconds: float, fail: bool = False) -> int:
    """``lock_weight`` of the stacked modes (called with the bound arguments as keywords):
    every third call is heavy (2), the others weigh 1."""
    del key, seconds, fail
    return 2 if n % 3 == 0 else 1


@dataclass(frozen=True)
class Mode:
    """One locked task and what it promises."""

    name: str
    summary: str
    options: Mapping[str, Any]
    terminals: frozenset[str]
    scope: str = "run"
    #: How many runs of one key may proceed at once (``lock_limit``).
    limit: int = 1
    #: ``lock_hold`` of a ``lock_release="success"`` mode: a success keeps its slot this long.
    hold: float | None = None
    #: ``lock_rate_limit`` as (starts, window seconds).
    rate: tuple[int, float] | None = None
    #: ``lock_debounce`` and ``lock_debounce_max_wait``.
    debounce: float | None = None
    max_wait: float | None = None
    #: Calls that share an ``AsyncResult`` id run the latest call's arguments (coalesce,
    #: replace, debounce); otherwise a shared id runs the call that published it.
    latest_wins: bool = False
    #: Runs of one key must not overlap beyond ``limit`` (False under lock_release="start").
    exclusive: bool = True
    #: A task id's body completes at most once (queue scope remembers finished task ids;
    #: a debounced burst runs once). Run scope may run a redelivered task id again.
    once_per_id: bool = False
    #: Needs a prefork pool (lock_replace_running terminates the running pool process).
    prefork_only: bool = False
    #: Some calls pass fail=True.
    may_fail: bool = False
    #: The calls of one key start in the order they were made (lock_order="enqueue").
    ordered: bool = False
    #: Stacked limits (``lock_limits``): (template over the task's parameters, N) pairs. The
    #: checker renders each call's limit names from its arguments and proves that the
    #: weight of the runs inside a name never passes N (``limit_exceeded``).
    limits: tuple[tuple[str, int], ...] = ()
    #: ``lock_weight`` with ``limits``: an int, or a callable of the bound arguments
    #: (``key``, ``n``, ``seconds``, ``fail``, as keywords) returning one.
    weight: int | Callable[..., int] = 1
    #: A call that a stacked limit or its rate holds back waits in the lock Redis (parked
    #: under park; in queue scope it comes back with its hold), never in a worker: set from
    #: the options (see ``celery_singleton_lock.modes.held``).
    held_back: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)


def _mode(name: str, summary: str, terminals: str, **kwargs: Any) -> Mode:
    options = kwargs.pop("options", {})
    if kwargs.get("limits"):  # the task options follow the Mode's own description
        options = {**options, "lock_limits": [list(pair) for pair in kwargs["limits"]],
                   "lock_weight": kwargs.get("weight", 1)}  # fmt: skip
    # A late copy of a call recorded as finished never runs again (queue scope, order, a
    # parked call handed its key): when that run's worker died before storing its result,
    # the copy stores ResultLost.
    if kwargs.get("once_per_id") or options.get("lock_on_conflict") == "park":
        terminals += " result_lost"
    policy = options.get("lock_on_conflict", "skip")
    limited = bool(kwargs.get("limits"))
    kwargs["held_back"] = (
        (policy == "park" and (limited or "lock_rate_limit" in options))
        or (kwargs.get("scope") == "queue" and limited and policy not in ("raise", "wait"))
    )  # fmt: skip
    return Mode(name, summary, MappingProxyType(options), frozenset(terminals.split()), **kwargs)


def _stack_text(limits: Sequence[tuple[str, int]]) -> str:
    return "[" + ", ".join(f"{template}:{number}" for template, number in limits) + "]"


_QUEUE = {"lock_scope": "queue"}
_PARK = {"lock_on_conflict": "park"}
#: lock_queue_timeout of the ordered mode: how long a line waits for a call whose message
#: was lost (kombu's Redis transport loses one a killed worker had just popped).
ORDER_WAIT = 20.0

MODES: Mapping[str, Mode] = MappingProxyType(
    {
        mode.name: mode
        for mode in (
            _mode("run_skip", "run scope, skip", "ran skipped"),
            _mode(
                "run_wait", "run scope, wait", "ran raised",
                options={"lock_on_conflict": "wait", "lock_wait": LOCK_WAIT},
            ),
            _mode(
                "run_retry", "run scope, retry", "ran",
                options={"lock_on_conflict": "retry", "lock_retry_delay": RETRY_DELAY},
            ),
            _mode("run_raise", "run scope, raise", "ran raised",
                  options={"lock_on_conflict": "raise"}),
            _mode(
                "queue_skip", "queue scope, skip", "ran skipped deduplicated refused",
                options=_QUEUE, scope="queue", once_per_id=True,
            ),
            _mode(
                "queue_raise", "queue scope, raise", "ran raised refused",
                options={**_QUEUE, "lock_on_conflict": "raise"}, scope="queue",
                once_per_id=True,
            ),
            _mode(
                "coalesce", "coalesce (keep latest)", "ran coalesced refused",
                options={**_QUEUE, "lock_on_conflict": "coalesce"}, scope="queue",
                latest_wins=True, once_per_id=True,
            ),
            _mode(
                "replace", "replace (a running holder is followed)",
                "ran coalesced superseded refused",
                options={**_QUEUE, "lock_on_conflict": "replace"}, scope="queue",
                latest_wins=True, once_per_id=True,
            ),
            _mode(
                "replace_running", "replace + lock_replace_running (prefork)",
                "ran coalesced superseded refused",  # calls while the revoke lands: one follow-up
                options={**_QUEUE, "lock_on_conflict": "replace", "lock_replace_running": True},
                scope="queue", latest_wins=True, once_per_id=True, prefork_only=True,
            ),
            _mode(
                "coalesce_rate", f"coalesce + lock_rate_limit={RATE!r}", "ran coalesced refused",
                options={**_QUEUE, "lock_on_conflict": "coalesce", "lock_rate_limit": RATE},
                scope="queue", latest_wins=True, once_per_id=True, rate=RATE_PARSED,
            ),
            _mode(
                "debounce", f"lock_debounce={DEBOUNCE} (skip)", "ran debounced refused",
                options={"lock_debounce": DEBOUNCE}, debounce=DEBOUNCE, latest_wins=True,
                once_per_id=True,
            ),
            _mode(
                "debounce_max", f"lock_debounce={DEBOUNCE} + max_wait={MAX_WAIT} (retry)",
                "ran debounced refused",
                options={
                    "lock_debounce": DEBOUNCE, "lock_debounce_max_wait": MAX_WAIT,
                    "lock_on_conflict": "retry", "lock_retry_delay": RETRY_DELAY,
                },
                debounce=DEBOUNCE, max_wait=MAX_WAIT, latest_wins=True, once_per_id=True,
            ),
            _mode(
                "rate_retry", f"run scope, lock_rate_limit={RATE!r}, retry", "ran",
                options={"lock_rate_limit": RATE, "lock_on_conflict": "retry",
                         "lock_retry_delay": RETRY_DELAY},
                rate=RATE_PARSED,
            ),
            _mode(
                "rate_queue", f"queue scope, lock_rate_limit={RATE!r}, retry",
                "ran deduplicated refused",
                options={**_QUEUE, "lock_rate_limit": RATE, "lock_on_conflict": "retry"},
                scope="queue", rate=RATE_PARSED, once_per_id=True,
            ),
            _mode(
                "limit2", "lock_limit=2, wait", "ran raised",
                options={"lock_limit": 2, "lock_on_conflict": "wait", "lock_wait": LOCK_WAIT},
                limit=2,
            ),
            _mode(
                "limit2_success", f"lock_limit=2, lock_release='success', hold {HOLD} s, retry",
                "ran failed",
                options={"lock_limit": 2, "lock_release": "success", "lock_hold": HOLD,
                         "lock_on_conflict": "retry", "lock_retry_delay": RETRY_DELAY},
                limit=2, hold=HOLD, may_fail=True,
            ),
            _mode(
                "release_start", "queue scope, lock_release='start'",
                "ran skipped deduplicated refused",
                options={**_QUEUE, "lock_release": "start"}, scope="queue", exclusive=False,
            ),
            _mode(
                "success_run", f"run scope, lock_release='success', hold {HOLD} s, skip",
                "ran failed skipped",
                options={"lock_release": "success", "lock_hold": HOLD}, hold=HOLD,
                may_fail=True,
            ),
            _mode("park", "run scope, park", "ran", options=_PARK),
            _mode(
                "park_queue", "queue scope, park (at publish)", "ran refused",
                options={**_QUEUE, **_PARK}, scope="queue", once_per_id=True,
            ),
            _mode(
                "park_order", "run scope, park, lock_order='enqueue'", "ran",
                options={**_PARK, "lock_order": "enqueue", "lock_queue_timeout": ORDER_WAIT},
                once_per_id=True, ordered=True,
            ),
            _mode(
                "park_limit2_rate", f"lock_limit=2, lock_rate_limit={RATE!r}, park", "ran",
                options={**_PARK, "lock_limit": 2, "lock_rate_limit": RATE}, limit=2,
                rate=RATE_PARSED,
            ),
            _mode(
                "stack_wait", f"lock_limit=2 + lock_limits={_stack_text(STACK)}, weighted, wait",
                "ran raised",
                options={"lock_limit": 2, "lock_on_conflict": "wait", "lock_wait": LOCK_WAIT},
                limit=2, limits=STACK, weight=stack_weight,
            ),
            _mode(
                "stack_skip", f"lock_limits={_stack_text(STACK)}, weighted, skip", "ran skipped",
                limits=STACK, weight=stack_weight,
            ),
            _mode(
                "stack_retry", f"lock_limits={_stack_text(STACK)}, weighted, retry", "ran",
                options={"lock_on_conflict": "retry", "lock_retry_delay": RETRY_DELAY},
                limits=STACK, weight=stack_weight,
            ),
            _mode(
                "stack_raise", f"lock_limits={_stack_text(STACK)}, weighted, raise", "ran raised",
                options={"lock_on_conflict": "raise"}, limits=STACK, weight=stack_weight,
            ),
            _mode(
                "stack_park", f"lock_limits={_stack_text(STACK)}, weighted, park", "ran",
                options=_PARK, once_per_id=True, limits=STACK, weight=stack_weight,
            ),
            _mode(
                "stack_park_queue",
                f"queue scope + lock_limits={_stack_text(STACK)}, weighted, park",
                "ran refused", options={**_QUEUE, **_PARK}, scope="queue", once_per_id=True,
                limits=STACK, weight=stack_weight,
            ),
            _mode(
                "stack_queue", f"queue scope + lock_limits={_stack_text(STACK)}, weighted, skip",
                "ran skipped deduplicated refused", options=_QUEUE, scope="queue",
                once_per_id=True,
                limits=STACK, weight=stack_weight,
            ),
            _mode(
                "success_queue", f"queue scope, lock_release='success', hold {HOLD} s",
                "ran failed skipped deduplicated refused",
                options={**_QUEUE, "lock_release": "success", "lock_hold": HOLD},
                scope="queue", hold=HOLD, may_fail=True, once_per_id=True,
            ),
        )
    }
)  # fmt: skip

#: ``body(task, mode, key, n, seconds, fail) -> n``: what every mode's task runs.
Body = Callable[[AnyTask, str, str, int, float, bool], int]


def task_name(prefix: str, mode: str) -> str:
    """The Celery name of ``mode``'s task under ``prefix``."""
    return f"{prefix}.{mode}"


def _function(mode: str, body: Body) -> Callable[..., int]:
    def run(self: AnyTask, key: str, n: int, seconds: float, fail: bool = False) -> int:
        return body(self, mode, key, n, seconds, fail)

    run.__name__ = run.__qualname__ = mode
    run.__doc__ = MODES[mode].summary
    return run


def register(
    app: Celery, body: Body, *, prefix: str, modes: Mapping[str, Mode] = MODES
) -> dict[str, AnyTask]:
    """Define one locked task per mode on ``app`` (named ``<prefix>.<mode>``), running
    ``body``; return them by mode name. Every task retries without limit (the lock's own
    retries count against ``max_retries``) and keys on its ``key`` argument."""
    tasks: dict[str, AnyTask] = {}
    for mode in modes.values():
        make = cast("Callable[..., Callable[[Callable[..., int]], AnyTask]]", app.task)
        decorator = make(
            name=task_name(prefix, mode.name),
            base=LockedTask,
            bind=True,
            lock_keys=["key"],
            max_retries=None,
            ignore_result=False,
            shared=False,  # a prefork-only mode must not join another test's app
            **dict(mode.options),
        )
        tasks[mode.name] = decorator(_function(mode.name, body))
    return tasks
