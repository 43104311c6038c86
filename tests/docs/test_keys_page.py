"""Every key a real task run leaves in Redis has one of the forms docs/keys.md lists
(generated from the code by ``make docs-gen``), and the main forms are seen: locked tasks
run eagerly against a private redis-server, and each body reads every key of its app's
prefix while it holds its lock (a duplicate skipped inside it, a stacked limit, a slot, a
rate limit)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery

from celery_singleton_lock import LockedTask
from celery_singleton_lock.engine.keyspace import SUFFIXES
from celery_singleton_lock.testing import RedisServer
from tests.docs.test_generated import GEN


def form_pattern(form: str, prefix: str) -> re.Pattern[str]:
    """A documented form as a regular expression over the keys of ``prefix``."""
    task = r"[^:{}\s]+"
    lock = rf"{re.escape(prefix)}:{task}:\{{[0-9a-f]{{32}}\}}"
    stacked = rf"{re.escape(prefix)}:{task}:[0-9a-f]{{32}}:\{{{re.escape(prefix)}:stack\}}"
    suffixes = "|".join(
        re.escape(suffix) + (".+" if suffix.endswith(":") else "")
        for suffix in sorted(set(SUFFIXES.values()))
    )
    parts = {
        "<prefix>": re.escape(prefix),
        "<task name>": task,
        "<digest>": "[0-9a-f]{32}",
        "<key>": f"(?:{lock}|{stacked})",
        "<suffix>": f"(?:{suffixes})",
        "<i>": r"\d+",
        "<name>": ".+",
        "<task id>": ".+",
        "<group>": r"[^{}\s]+",
    }
    pattern = ""
    for piece in re.split(r"(<[^>]+>)", form):
        pattern += parts[piece] if piece in parts else re.escape(piece)
    return re.compile(pattern)


@pytest.fixture
def app(redis_server: RedisServer) -> Iterator[Celery]:
    """An eager app on the private server, under a prefix of its own."""
    app = Celery("keys-page", set_as_current=False)
    prefix = f"kp{uuid.uuid4().hex[:8]}"
    app.conf.update(
        task_always_eager=True, singleton_lock_url=redis_server.url, singleton_lock_prefix=prefix
    )
    yield app
    client = redis.Redis.from_url(redis_server.url)
    for pattern in (f"{prefix}*", f"{{{prefix}}}*"):
        for key in client.scan_iter(match=pattern):
            client.delete(key)
    client.close()


def test_every_key_a_run_leaves_has_a_documented_form(
    app: Celery, redis_server: RedisServer
) -> None:
    """Keys read inside the bodies of real runs each match a form of the page; the task
    lock, the stacked lock, a slot, a stack limit, a skip record and a companion key are
    among them."""
    prefix = app.conf.singleton_lock_prefix
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    seen: set[str] = set()

    def snapshot() -> None:
        for pattern in (f"{prefix}*", f"{{{prefix}}}*"):
            seen.update(client.scan_iter(match=pattern))

    @app.task(base=LockedTask, shared=False, name="shop.buy", lock_keys=["sku"], bind=True)
    def buy(self: Any, sku: str, user_id: int) -> None:
        if user_id == 1:
            buy.delay(sku, 2)  # the same SKU inside its run: skipped, and recorded
        snapshot()

    @app.task(
        base=LockedTask, shared=False, name="reports.export", lock_keys=["tenant"],
        lock_limits=[("tenant:{tenant}", 2)],
    )  # fmt: skip
    def export(tenant: str) -> None:
        snapshot()

    @app.task(base=LockedTask, shared=False, name="jobs.slot", lock_keys=(), lock_limit=2)
    def slot(depth: int) -> None:
        if depth == 0:
            slot.delay(1)  # the second slot, taken while the first is held
        snapshot()

    @app.task(base=LockedTask, shared=False, name="jobs.paced", lock_rate_limit="10/m")
    def paced() -> None:
        snapshot()

    try:
        buy.delay("sku-42", 1).get()
        export.delay("acme").get()
        slot.delay(0).get()
        paced.delay().get()
    finally:
        client.close()

    forms = [form for form, _, _ in GEN.key_forms()]
    patterns = {form: form_pattern(form, prefix) for form in forms}
    unmatched = [key for key in seen if not any(p.fullmatch(key) for p in patterns.values())]
    assert not unmatched, f"keys of no documented form: {sorted(unmatched)}"
    matched = {form for form, p in patterns.items() if any(p.fullmatch(key) for key in seen)}
    assert {
        "<prefix>:<task name>:{<digest>}",
        "<prefix>:<task name>:<digest>:{<prefix>:stack}",
        "<key>:<suffix>",
        "<key>:slot:<i>",
        "<prefix>:{<prefix>:stack}:limit:<name>",
        "<prefix>~skipped:<task id>",
    } <= matched, sorted(seen)


def test_the_forms_match_the_examples_the_code_builds() -> None:
    """Each form's pattern matches the example beside it (built by the code), and a key
    of another shape matches none."""
    for form, example, _ in GEN.key_forms():
        key = example.replace("<task id>", "d9c1f0de")
        assert form_pattern(form, "csl").fullmatch(key), (form, key)
    assert not any(
        form_pattern(form, "csl").fullmatch("csl:shop.buy:{18ef3d00}:nope")
        for form, _, _ in GEN.key_forms()
    )
