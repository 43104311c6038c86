"""The lock engine: ``RedisLock`` and everything under it (the two wire protocols, the value
grammar, renewal, the keyspace of companion keys and the Lua scripts). It imports nothing
from Celery, so it serves any Python program."""

from __future__ import annotations

from celery_singleton_lock.engine.keyspace import companion_key
from celery_singleton_lock.engine.lock import RedisLock
from celery_singleton_lock.engine.value import Holder

__all__ = ["Holder", "RedisLock", "companion_key"]
