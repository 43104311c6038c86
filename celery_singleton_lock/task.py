"""``LockedTask``: a Celery task that runs at most once at a time per (name, arguments).

The class only plugs :mod:`.runtime` into Celery's ``Task``: its ``__call__`` runs the body
under the lock, its ``apply_async`` takes queue-scope locks at publish, and binding it to an
app sets that app up (:func:`.integration.setup`). Its options are the ``lock_*`` names of
the table in :mod:`.options`, given to ``@app.task(base=LockedTask, lock_keys=[...])``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from celery import Task

from celery_singleton_lock import runtime
from celery_singleton_lock.integration import lock_explain_method, setup
from celery_singleton_lock.options import task_option_names
from celery_singleton_lock.runtime import LOCKED_MARKER, current_lock

if TYPE_CHECKING:
    from celery import Celery
    from celery.result import AsyncResult

    # celery-types makes Task generic; Celery itself is subscriptable only from 5.7.
    _Base = Task[Any, Any]
else:
    _Base = Task

__all__ = ["LockedTask", "current_lock"]


class LockedTask(_Base):
    """Base class for tasks that must not run twice at once for the same arguments.

    Options are class attributes, usually given to ``@app.task``: ``lock_keys``,
    ``lock_timeout``, ``lock_renew``, ``lock_on_conflict``, ``lock_scope``, ``lock_wait``,
    ``lock_retry_delay``, ``lock_queue_timeout``, ``lock_rate_limit``, ``lock_release``,
    ``lock_hold`` (see :mod:`.options`); None means "from the ``singleton_lock_*``
    settings" (or the option's default).
    """

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return runtime.locked_call(self, args, kwargs, super().__call__)

    def apply_async(  # type: ignore[override]  # same call shape, options forwarded as-is
        self, args: Any = None, kwargs: Any = None, **options: Any
    ) -> AsyncResult[Any]:
        return runtime.locked_apply_async(self, super().apply_async, args, kwargs, **options)

    lock_key = runtime.lock_key_method

    #: ``task.lock_explain(*args, **kwargs)``: why a call with these arguments would be
    #: blocked now (see :class:`~celery_singleton_lock.explain.Explanation`).
    lock_explain = lock_explain_method

    @classmethod
    def on_bound(cls, app: Celery) -> None:
        """Celery binds the task class to ``app``: make sure the app is set up."""
        setup(app)


setattr(LockedTask, LOCKED_MARKER, True)
for _name in task_option_names():
    setattr(LockedTask, _name, None)
