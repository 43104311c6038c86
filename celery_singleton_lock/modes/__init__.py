"""The registry of modes: every conflict policy, scope and mode, and the rules about which
options go together.

A task's effective options select one conflict policy (``lock_on_conflict``), one scope
(``lock_scope``) and the modes whose ``applies`` says yes; :func:`plan_for` puts them in
the order the pipelines call their hooks. Adding a mode is a module of its own with a
:class:`~.base.Mode` subclass, one line in :data:`MODES` (or :data:`POLICIES`), its option
rows in :mod:`celery_singleton_lock.options` and its docs; a mode that keeps state beside
a lock key adds its state face (:mod:`.face`) to :data:`FACES` (:mod:`.faces`), which is
how an explanation reads and shows that state.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from celery.exceptions import ImproperlyConfigured

from celery_singleton_lock.modes.base import ConflictPolicy, Mode, Scope
from celery_singleton_lock.modes.debounce import Debounce
from celery_singleton_lock.modes.faces import FACES
from celery_singleton_lock.modes.followup import Coalesce, Replace
from celery_singleton_lock.modes.held import HoldBack
from celery_singleton_lock.modes.lifetime import HoldAfterSuccess, ReleaseAtStart
from celery_singleton_lock.modes.order import Order
from celery_singleton_lock.modes.park import Park
from celery_singleton_lock.modes.policies import Raise, Retry, Skip, Wait
from celery_singleton_lock.modes.scope import QueueScope, RunScope
from celery_singleton_lock.modes.throttle import Throttle
from celery_singleton_lock.modes.watch import RaiseOnLost
from celery_singleton_lock.options import OPTION_RULES, Combination, LockOptions, Settings

__all__ = [
    "COMBINATIONS",
    "FACES",
    "MODES",
    "PHASES",
    "POLICIES",
    "REPORTED",
    "SCOPES",
    "ConflictPolicy",
    "Mode",
    "Plan",
    "Scope",
    "check_combinations",
    "plan_for",
    "policies_markdown",
]

#: ``lock_on_conflict`` values and the policy each one names.
POLICIES: Mapping[str, ConflictPolicy] = MappingProxyType(
    {
        policy.name: policy
        for policy in (Skip(), Wait(), Retry(), Raise(), Coalesce(), Replace(), Park())
    }
)
#: ``lock_scope`` values and the scope each one names.
SCOPES: Mapping[str, Scope] = MappingProxyType(
    {scope.name: scope for scope in (RunScope(), QueueScope())}
)
#: The modes some options switch on, in the order their hooks run.
MODES: tuple[type[Mode], ...] = (
    Debounce,
    Order,
    HoldBack,
    Throttle,
    ReleaseAtStart,
    HoldAfterSuccess,
    RaiseOnLost,
)

#: The ``policy`` values the lock's signals report, and the policy (or mode) class each
#: names: what observers ask instead of comparing names (``outcome``, ``waits``,
#: ``fails_caller``, ``keeps_calls``).
REPORTED: Mapping[str, type[Mode]] = MappingProxyType(
    {
        kind.reported: kind
        for kind in (*(type(policy) for policy in POLICIES.values()), *MODES)
        if kind.reported
    }
)

#: Every rule about options that cannot go together: the options' own, then each mode's.
COMBINATIONS: tuple[Combination, ...] = OPTION_RULES + tuple(
    rule
    for kind in (*(type(policy) for policy in POLICIES.values()), *MODES)
    for rule in kind.__dict__.get("rules", ())
)


#: The hooks a phase of the pipelines calls (:class:`~.base.Mode`'s methods of those names).
PHASES = (
    "claim",
    "deliver",
    "admit",
    "start",
    "guard",
    "release",
    "forget",
    "finished_keep",
    "busy_countdown",
    "before_publish",
)


def _overrides(hooks: tuple[Mode, ...], phase: str) -> tuple[Mode, ...]:
    """Those of ``hooks`` whose class changes ``phase`` (the others would only pass)."""
    default = getattr(Mode, phase)
    return tuple(mode for mode in hooks if getattr(type(mode), phase) is not default)


@dataclass(frozen=True)
class Plan:
    """What the pipelines call for one set of effective options: for each phase, only the
    policy, scope and modes that do something there, so a task pays for the modes it has
    and nothing else (a task with default options calls no hook at all)."""

    policy: ConflictPolicy
    scope: Scope
    modes: tuple[Mode, ...]
    claim: tuple[Mode, ...] = ()
    deliver: tuple[Mode, ...] = ()
    admit: tuple[Mode, ...] = ()
    start: tuple[Mode, ...] = ()
    guard: tuple[Mode, ...] = ()
    release: tuple[Mode, ...] = ()
    forget: tuple[Mode, ...] = ()
    finished_keep: tuple[Mode, ...] = ()
    busy_countdown: tuple[Mode, ...] = ()
    before_publish: tuple[Mode, ...] = ()

    @property
    def hooks(self) -> tuple[Mode, ...]:
        """Everyone whose hooks a phase calls, in order: the scope, the modes, the policy."""
        return (self.scope, *self.modes, self.policy)


@functools.lru_cache(maxsize=256)
def plan_for(options: LockOptions) -> Plan:
    """The plan of a task (or of one call with per-call options)."""
    policy, scope = POLICIES[options.on_conflict], SCOPES[options.scope]
    modes = tuple(mode() for mode in MODES if mode.applies(options))
    hooks = (scope, *modes, policy)
    phases = {phase: _overrides(hooks, phase) for phase in PHASES}
    return Plan(policy, scope, modes, **phases)


def check_combinations(options: LockOptions, where: str, settings: Settings | None = None) -> None:
    """Raise ``ImproperlyConfigured`` naming every rule of :data:`COMBINATIONS` that
    ``options`` break (one line, prefixed by ``where``, e.g. ``"task 'proj.sync'"``)."""
    broken = [rule.message for rule in COMBINATIONS if rule.invalid(options, settings)]
    if broken:
        raise ImproperlyConfigured(f"{where}: " + "; ".join(broken))


def policies_markdown() -> str:
    """The reference table of the conflict policies for the docs, generated from
    :data:`POLICIES`: each ``lock_on_conflict`` value and its class's docstring."""
    lines = [
        "| `lock_on_conflict` | a run or call that finds its key held |",
        "|---|---|",
    ]
    for name, policy in POLICIES.items():
        doc = " ".join(inspect.cleandoc(type(policy).__doc__ or "").split())
        doc = doc.replace("``", "`").replace("|", "\\|")
        lines.append(f'| `"{name}"` | {doc} |')
    return "\n".join(lines) + "\n"
