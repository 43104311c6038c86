"""The tiny Celery app the ``celery locks`` tests run the real CLI against.

Configured from the environment: ``CSL_CLI_URL`` is both the broker and the lock Redis,
``CSL_CLI_PREFIX`` the lock prefix (each test uses its own on the shared server),
``CSL_CLI_SCRIPTING=0`` selects the plain-command protocol.
"""

from __future__ import annotations

import os

from celery import Celery

from celery_singleton_lock import LockedTask

URL = os.environ.get("CSL_CLI_URL", "redis://127.0.0.1:6399/0")

app = Celery("cliproj", broker=URL)
app.conf.update(
    singleton_lock_url=URL,
    singleton_lock_prefix=os.environ.get("CSL_CLI_PREFIX", "csl"),
    singleton_lock_scripting=os.environ.get("CSL_CLI_SCRIPTING", "1") != "0",
)


@app.task(shared=False, name="shop.buy", base=LockedTask, lock_keys=["sku"])
def buy(sku: str, user_id: int) -> str:
    """Sell one unit of ``sku`` to ``user_id`` (the body never runs in these tests)."""
    return f"{sku}:{user_id}"


@app.task(shared=False, name="shop.restock")
def restock(sku: str) -> None:
    """A task that is not locked, for the "not locked" error of ``locks key``."""


if os.environ.get("CSL_CLI_PARK") == "1":

    @app.task(
        shared=False,
        name="shop.reserve",
        base=LockedTask,
        lock_keys=["sku"],
        lock_on_conflict="park",
    )
    def reserve(sku: str) -> str:
        """A task whose calls park in the lock Redis (for the durability check)."""
        return sku
