"""``celery_singleton_lock.otel`` on a real prefork worker traced by OpenTelemetry's SDK and
``opentelemetry-instrumentation-celery``: the lock spans are children of the task's run span,
in the trace its producer started.

The worker's pool processes write their finished spans as JSON lines
(``tests/observe/otelproj.py``); this process publishes with the Celery instrumentation on a
private ``TracerProvider`` whose spans go to the SDK's ``InMemorySpanExporter``, so the
producer's ``apply_async/...`` span and the worker's spans make one trace. The trace of a
waited run is rendered as ``docs/observability.md`` prints it, and compared with the page.
The outcomes a worker rarely shows (a wait that runs out, a lost lease) run eagerly here.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import redis
from celery import Celery
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from celery_singleton_lock import LockedTask, RedisLock, otel, signals
from celery_singleton_lock.testing import CeleryWorker, RedisServer
from tests.worker.conftest import wait_for

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "observability.md"
#: The line above the trace sample's ```text block in the docs.
SAMPLE_MARKER = "<!-- trace sample: tests/observe/test_otel.py -->"
SAMPLE_OUT = ROOT / "build" / "otel-trace-sample.txt"

Span = dict[str, Any]


@pytest.fixture(scope="module")
def otelproj(obs_redis: RedisServer) -> ModuleType:
    """The traced test project, imported with its environment pointing at our server."""
    os.environ["CSL_OBS_URL"] = obs_redis.url
    return importlib.import_module("tests.observe.otelproj")


@pytest.fixture(scope="module")
def spans_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the worker's pool processes write their spans."""
    return tmp_path_factory.mktemp("otel-spans")


@pytest.fixture(scope="module")
def otel_worker(
    otelproj: ModuleType,
    obs_redis: RedisServer,
    spans_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[CeleryWorker]:
    """A prefork worker with three pool processes, each traced and writing to ``spans_dir``."""
    worker = CeleryWorker(
        "tests.observe.otelproj", concurrency=3, hostname="otel@%h", cwd=ROOT,
        log_path=tmp_path_factory.mktemp("otel") / "worker.log", ready_timeout=120,
        env={
            "CSL_OBS_URL": obs_redis.url,
            "CSL_OTEL_SPANS": str(spans_dir),
            "PYTHONPATH": str(ROOT),
        },
    )  # fmt: skip
    with worker:
        yield worker


@pytest.fixture(scope="module")
def producer_spans() -> Iterator[InMemorySpanExporter]:
    """This process publishes with the Celery instrumentation (on a private provider, so
    nothing global changes for other tests), its spans kept in memory; undone at the end."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor = CeleryInstrumentor()  # type: ignore[no-untyped-call]
    instrumentor.instrument(tracer_provider=provider)
    yield exporter
    instrumentor.uninstrument()
    provider.shutdown()


@pytest.fixture
def traced(
    otel_worker: CeleryWorker, producer_spans: InMemorySpanExporter, otelproj: ModuleType
) -> ModuleType:
    """The project, with its traced worker running and this process's publishes traced."""
    return otelproj


# -- reading the spans -------------------------------------------------------------------------


def worker_spans(directory: Path) -> list[Span]:
    """Every span the worker's pool processes finished so far."""
    found = []
    for path in sorted(directory.glob("spans-*.jsonl")):
        found += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return found


def producer_records(project: ModuleType, exporter: InMemorySpanExporter) -> list[Span]:
    """The spans this process finished, in the worker's record format."""
    return [project.span_record(span) for span in exporter.get_finished_spans()]


def of_task(spans: list[Span], name: str, task_id: str) -> list[Span]:
    """The spans named ``name`` about the run ``task_id`` (the instrumentation's run span
    carries it as ``messaging.message.id``, the lock spans as ``celery.task_id``)."""
    return [
        span
        for span in spans
        if span["name"] == name
        and task_id
        in (
            span["attributes"].get("celery.task_id"),
            span["attributes"].get("messaging.message.id"),
        )
    ]


def wait_spans(
    directory: Path, want: Callable[[list[Span]], bool], timeout: float = 20
) -> list[Span]:
    """The worker's spans once ``want`` says they are all there (at most ``timeout`` s)."""
    found: list[Span] = []

    def ready() -> bool:
        nonlocal found
        found = worker_spans(directory)
        return want(found)

    assert wait_for(ready, timeout), f"spans not there within {timeout} s: {found}"
    return found


def one(spans: list[Span], name: str, task_id: str) -> Span:
    (span,) = of_task(spans, name, task_id)
    return span


def seconds(span: Span) -> float:
    return float(span["end"] - span["start"]) / 1e9


def assert_child_of_run(span: Span, run: Span) -> None:
    """``span`` is a child of the task's run span, in its trace."""
    assert run["name"].startswith("run/"), run
    assert (span["trace_id"], span["parent_id"]) == (run["trace_id"], run["span_id"]), (span, run)


# -- the cases ----------------------------------------------------------------------------------


def test_a_waited_run_has_an_acquire_span_with_its_wait_and_holder(
    traced: ModuleType, spans_dir: Path, producer_spans: InMemorySpanExporter, name: str
) -> None:
    """A ``wait`` run that found its key held: its ``lock.acquire`` span covers the wait
    (start set back by the time waited), says ``waited-and-acquired`` and whom it waited
    for, and is a child of the run span opentelemetry-instrumentation-celery opened, in the
    trace the producer's ``apply_async`` span started; its ``lock.hold`` follows."""
    holder = traced.waiter.delay(name, 1.0)
    wait_spans(spans_dir, lambda spans: bool(of_task(spans, "lock.acquire", holder.id)))
    waited = traced.waiter.delay(name, 0.2)
    assert holder.get(timeout=30) == "ran"
    assert waited.get(timeout=30) == "ran"
    spans = wait_spans(
        spans_dir,
        lambda spans: all(
            of_task(spans, span, task.id)
            for span in ("run/otel.waiter", "lock.hold")
            for task in (holder, waited)
        ),
    )
    run = one(spans, "run/otel.waiter", waited.id)
    acquire = one(spans, "lock.acquire", waited.id)
    hold = one(spans, "lock.hold", waited.id)
    first = one(spans, "lock.acquire", holder.id)
    attributes = acquire["attributes"]
    assert attributes["lock.outcome"] == "waited-and-acquired"
    assert attributes["lock.holder_task_id"] == holder.id
    assert attributes["lock.policy"] == "wait"
    assert attributes["lock.key"] == traced.waiter.lock_key(name, 0)
    assert 0.5 < attributes["lock.waited"] < 1.5
    assert seconds(acquire) == pytest.approx(attributes["lock.waited"], abs=0.01)
    assert attributes["lock.fencing_token"] > first["attributes"]["lock.fencing_token"]
    (conflict,) = acquire["events"]
    assert conflict["name"] == "lock.conflict"
    assert conflict["attributes"] == {"lock.holder_task_id": holder.id}
    assert first["attributes"]["lock.outcome"] == "acquired"
    assert first["attributes"]["lock.waited"] < 0.2
    assert_child_of_run(acquire, run)
    assert_child_of_run(hold, run)
    assert hold["start"] >= acquire["end"]
    assert hold["attributes"]["lock.fencing_token"] == attributes["lock.fencing_token"]
    # The producer's span starts the trace: the whole path of the call is one trace.
    published = one(producer_records(traced, producer_spans), "apply_async/otel.waiter", waited.id)
    assert (run["trace_id"], run["parent_id"]) == (published["trace_id"], published["span_id"])

    sample = render([published, *spans], published["trace_id"])
    SAMPLE_OUT.parent.mkdir(exist_ok=True)
    SAMPLE_OUT.write_text(sample, encoding="utf-8")
    documented = documented_sample()
    assert normalized(documented) == normalized(sample), (
        f"the trace in {DOC.name} no longer has the shape of a real one; "
        f"copy {SAMPLE_OUT.relative_to(ROOT)} there:\n{sample}"
    )


def test_the_hold_span_has_the_fencing_token_and_the_renewals(
    traced: ModuleType, spans_dir: Path, name: str
) -> None:
    """A run's ``lock.hold`` span runs from acquiring to releasing its key, carries the
    hold's fencing token, a ``lock.renewed`` event per lease extension and the run's end."""
    result = traced.renewed.delay(name, 1.2)
    assert result.get(timeout=30) == "ran"
    spans = wait_spans(spans_dir, lambda spans: bool(of_task(spans, "run/otel.renewed", result.id)))
    run = one(spans, "run/otel.renewed", result.id)
    acquire = one(spans, "lock.acquire", result.id)
    hold = one(spans, "lock.hold", result.id)
    attributes = hold["attributes"]
    token = acquire["attributes"]["lock.fencing_token"]
    assert isinstance(token, int)
    assert attributes["lock.fencing_token"] == token
    assert attributes["lock.key"] == traced.renewed.lock_key(name, 0)
    assert attributes["lock.state"] == "SUCCESS"
    assert attributes["lock.released"] is True
    assert 1.2 <= attributes["lock.held"] < 3
    assert seconds(hold) == pytest.approx(attributes["lock.held"], abs=0.05)
    renewals = [event for event in hold["events"] if event["name"] == "lock.renewed"]
    assert len(renewals) == attributes["lock.renewals"] >= 3
    assert all(event["attributes"] == {"lock.fencing_token": token} for event in renewals)
    assert hold["status"] == "UNSET"
    assert_child_of_run(hold, run)
    assert_child_of_run(acquire, run)
    assert run["start"] <= acquire["start"] <= acquire["end"] <= hold["start"]
    assert hold["end"] <= run["end"]


def test_a_skipped_duplicate_has_a_skipped_acquire_span_and_no_hold(
    traced: ModuleType, spans_dir: Path, name: str
) -> None:
    """A duplicate under ``skip`` gets a ``lock.acquire`` span saying ``skipped`` and who
    holds the key, under its run span; it held nothing, so it has no ``lock.hold``."""
    first = traced.job.delay(name, 1.0)
    wait_spans(spans_dir, lambda spans: bool(of_task(spans, "lock.acquire", first.id)))
    duplicate = traced.job.delay(name, 0)
    assert duplicate.get(timeout=30) is None
    assert first.get(timeout=30) == "ran"
    spans = wait_spans(
        spans_dir,
        lambda spans: all(of_task(spans, "run/otel.job", task.id) for task in (first, duplicate)),
    )
    acquire = one(spans, "lock.acquire", duplicate.id)
    attributes = acquire["attributes"]
    assert attributes["lock.outcome"] == "skipped"
    assert attributes["lock.policy"] == "skip"
    assert attributes["lock.holder_task_id"] == first.id
    assert attributes["lock.key"] == traced.job.lock_key(name, 0)
    assert "lock.fencing_token" not in attributes
    assert acquire["status"] == "UNSET"
    assert_child_of_run(acquire, one(spans, "run/otel.job", duplicate.id))
    assert not of_task(spans, "lock.hold", duplicate.id)
    assert one(spans, "lock.hold", first.id)["attributes"]["lock.released"] is True


def test_a_parked_run_has_a_parked_acquire_span_then_its_run(
    traced: ModuleType, spans_dir: Path, name: str
) -> None:
    """A run that finds its key held under ``park`` gets a ``lock.acquire`` span saying
    ``parked``, with its place in the key's park queue, under its run span; when it is
    handed the key, the same task id runs as a delivery of its own: ``acquired``, a hold."""
    first = traced.parked.delay(name, 1.0)
    wait_spans(spans_dir, lambda spans: bool(of_task(spans, "lock.acquire", first.id)))
    later = traced.parked.delay(name, 0)
    assert later.get(timeout=30) == "ran"
    assert first.get(timeout=30) == "ran"
    spans = wait_spans(  # a run's span is written after the hold's, which it contains
        spans_dir,
        lambda spans: (
            bool(of_task(spans, "lock.hold", later.id))
            and len(of_task(spans, "run/otel.parked", later.id)) >= 2
        ),
    )
    outcomes = sorted(
        span["attributes"]["lock.outcome"] for span in of_task(spans, "lock.acquire", later.id)
    )
    assert outcomes == ["acquired", "parked"]
    (parked,) = (
        span
        for span in of_task(spans, "lock.acquire", later.id)
        if span["attributes"]["lock.outcome"] == "parked"
    )
    attributes = parked["attributes"]
    assert attributes["lock.queue_position"] == 1
    assert attributes["lock.key"] == traced.parked.lock_key(name, 0)
    assert attributes["lock.scope"] == "run"
    assert parked["status"] == "UNSET"
    runs = of_task(spans, "run/otel.parked", later.id)
    assert len(runs) == 2  # the delivery that parked, and the one handed the key
    assert any(
        (parked["trace_id"], parked["parent_id"]) == (run["trace_id"], run["span_id"])
        for run in runs
    )


def test_a_limit_parked_run_has_one_parked_acquire_span_per_try(
    traced: ModuleType, spans_dir: Path, name: str
) -> None:
    """Issue 31 finding 3: a call that a stacked limit holds back under ``park`` (its own
    key free) gets one ``lock.acquire`` span for that try, outcome ``parked`` (from the
    documented set, carrying the policy), then, once the limit has room, ``acquired``
    and a hold: no second span of the same try with an outcome ``park``."""
    first = traced.limited.delay(name, 1, 1.5)
    wait_spans(spans_dir, lambda spans: bool(of_task(spans, "lock.acquire", first.id)), 60)
    later = traced.limited.delay(name, 2, 0)
    assert later.get(timeout=60) == "ran"
    assert first.get(timeout=60) == "ran"
    spans = wait_spans(
        spans_dir,
        lambda spans: (
            bool(of_task(spans, "lock.hold", later.id))
            and len(of_task(spans, "run/otel.limited", later.id)) >= 2
        ),
        60,
    )
    acquires = of_task(spans, "lock.acquire", later.id)
    outcomes = sorted(span["attributes"]["lock.outcome"] for span in acquires)
    assert outcomes == ["acquired", "parked"]
    assert set(outcomes) <= set(otel.OUTCOMES)
    (parked,) = (span for span in acquires if span["attributes"]["lock.outcome"] == "parked")
    assert parked["attributes"]["lock.policy"] == "park"
    assert parked["attributes"]["lock.key"] == traced.limited.lock_key(name, 2, 0)
    runs = of_task(spans, "run/otel.limited", later.id)
    assert any(
        (parked["trace_id"], parked["parent_id"]) == (run["trace_id"], run["span_id"])
        for run in runs
    )


def test_a_throttled_run_has_a_throttled_acquire_span(
    traced: ModuleType, spans_dir: Path, name: str
) -> None:
    """A run over its key's ``lock_rate_limit`` does not start: its ``lock.acquire`` span
    says ``throttled``, with the rate and the time until the next free start."""
    first = traced.paced.delay(name)
    assert first.get(timeout=30) == "ran"
    second = traced.paced.delay(name)
    assert second.get(timeout=30) is None
    spans = wait_spans(spans_dir, lambda spans: bool(of_task(spans, "run/otel.paced", second.id)))
    acquire = one(spans, "lock.acquire", second.id)
    attributes = acquire["attributes"]
    assert attributes["lock.outcome"] == "throttled"
    assert attributes["lock.policy"] == "skip"
    assert attributes["lock.rate"] == "1/m"
    assert 0 < attributes["lock.retry_in"] <= 60
    assert "lock.holder_task_id" not in attributes
    assert_child_of_run(acquire, one(spans, "run/otel.paced", second.id))
    assert not of_task(spans, "lock.hold", second.id)
    assert one(spans, "lock.acquire", first.id)["attributes"]["lock.outcome"] == "acquired"


# -- the trace in the docs -----------------------------------------------------------------------

#: The attributes the sample shows, in this order (the rest are the instrumentation's).
SHOWN = (
    "celery.task_id",
    "messaging.message.id",
    "lock.outcome",
    "lock.key",
    "lock.policy",
    "lock.scope",
    "lock.holder_task_id",
    "lock.waited",
    "lock.fencing_token",
    "lock.held",
    "lock.renewals",
    "lock.state",
    "lock.released",
)


def shown(value: Any) -> str:
    """An attribute's value as the sample shows it: seconds to the millisecond."""
    return f"{value:.3f}" if isinstance(value, float) else repr(value)


def render(spans: list[Span], trace_id: str) -> str:
    """The trace ``trace_id`` as a tree: each span with its start (from the trace's start)
    and duration, the attributes of :data:`SHOWN` and its events."""
    spans = sorted((s for s in spans if s["trace_id"] == trace_id), key=lambda s: s["start"])
    origin = spans[0]["start"]
    children: dict[str | None, list[Span]] = {}
    ids = {span["span_id"] for span in spans}
    for span in spans:
        children.setdefault(span["parent_id"] if span["parent_id"] in ids else None, []).append(
            span
        )
    lines = [f"trace {trace_id}"]

    def at(ns: int) -> str:
        return f"+{(ns - origin) / 1e9:.3f} s"

    def show(span: Span, lead: str, last: bool) -> None:
        branch, more = ("└── ", "    ") if last else ("├── ", "│   ")
        lines.append(f"{lead}{branch}{span['name']}  {at(span['start'])}  {seconds(span):.3f} s")
        inner = lead + more
        below = children.get(span["span_id"], [])
        detail = inner + ("│   " if below else "    ")
        for key in SHOWN:
            if key in span["attributes"]:
                lines.append(f"{detail}{key} = {shown(span['attributes'][key])}")
        for event in span["events"]:
            values = ", ".join(f"{k}={shown(v)}" for k, v in event["attributes"].items())
            lines.append(f"{detail}event {event['name']} {at(event['at'])} {values}".rstrip())
        for index, child in enumerate(below):
            show(child, inner, index == len(below) - 1)

    roots = children.get(None, [])
    for index, root in enumerate(roots):
        show(root, "", index == len(roots) - 1)
    return "\n".join(lines) + "\n"


_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_HEX = re.compile(r"\b[0-9a-f]{16,}\b")
_NUMBER = re.compile(r"\d+\.\d+|\b\d{4,}\b")


def normalized(text: str) -> str:
    """``text`` with what differs between two runs of the same trace masked: ids, hashes,
    times and durations, fencing tokens (a run's numbers depend on the clock)."""
    text = _UUID.sub("<id>", text)
    text = _HEX.sub("<hex>", text)
    return _NUMBER.sub("<n>", text)


def documented_sample() -> str:
    """The ```text block under :data:`SAMPLE_MARKER` in the docs page."""
    lines = DOC.read_text(encoding="utf-8").splitlines()
    assert SAMPLE_MARKER in lines, f"{DOC.name} has no trace sample ({SAMPLE_MARKER})"
    start = lines.index(SAMPLE_MARKER) + 1
    assert lines[start].strip() == "```text", lines[start]
    end = lines.index("```", start + 1)
    return "\n".join(lines[start + 1 : end]) + "\n"


# -- the outcomes a worker rarely shows, run eagerly in this process ------------------------------


@pytest.fixture
def eager(obs_redis: RedisServer) -> Iterator[tuple[Celery, InMemorySpanExporter]]:
    """An eager app of this process whose lock spans go to an in-memory exporter."""
    app = Celery("eager_otel", broker=obs_redis.url, backend=obs_redis.url)
    app.conf.update(
        task_always_eager=True,
        singleton_lock_url=obs_redis.url,
        singleton_lock_prefix="otel-eager",
    )
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.install(app, tracer_provider=provider)
    yield app, exporter
    otel.uninstall(app)
    provider.shutdown()


def finished(exporter: InMemorySpanExporter, name: str) -> list[Any]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


def test_a_wait_that_runs_out_and_a_raise_end_in_error_spans(
    eager: tuple[Celery, InMemorySpanExporter], name: str
) -> None:
    """A ``wait`` run whose ``lock_wait`` runs out gets a ``timed-out`` span from its first
    try to the end of the wait (made when the run ends, as no signal says it); a ``raise``
    run a ``raised`` one; both with an error status."""
    app, exporter = eager

    @app.task(name="eager.waits", base=LockedTask, lock_keys=["name"], lock_on_conflict="wait",
              lock_wait=0.3)  # fmt: skip
    def waits(name: str) -> str:
        return "ran"

    @app.task(name="eager.raises", base=LockedTask, lock_keys=["name"], lock_on_conflict="raise")
    def raises(name: str) -> str:
        return "ran"

    client = redis.Redis.from_url(app.conf.singleton_lock_url)
    holds = [RedisLock(client, task.lock_key(name), timeout=10) for task in (waits, raises)]
    for lock in holds:
        assert lock.acquire(blocking=False)
    try:
        assert waits.apply(args=(name,)).failed()
        assert raises.apply(args=(name,)).failed()
    finally:
        for lock in holds:
            lock.release()
        client.close()
    spans = {
        span.attributes["celery.task_name"]: span for span in finished(exporter, "lock.acquire")
    }
    timed_out, raised = spans["eager.waits"], spans["eager.raises"]
    assert timed_out.attributes["lock.outcome"] == "timed-out"
    assert timed_out.status.status_code.name == "ERROR"
    assert (timed_out.end_time - timed_out.start_time) / 1e9 >= 0.3
    assert [event.name for event in timed_out.events] == ["lock.conflict"]
    assert raised.attributes["lock.outcome"] == "raised"
    assert raised.status.status_code.name == "ERROR"
    assert not finished(exporter, "lock.hold")


def test_a_lost_lease_marks_the_hold_span(
    eager: tuple[Celery, InMemorySpanExporter], name: str
) -> None:
    """A run whose unrenewed lease ran out while its body ran: its hold span gets a
    ``lock.lost`` event and an error status."""
    app, exporter = eager

    @app.task(name="eager.overrun", base=LockedTask, lock_keys=["name"], lock_timeout=0.5,
              lock_renew=False)  # fmt: skip
    def overrun(name: str) -> str:
        time.sleep(1.0)
        return "ran"

    assert overrun.apply(args=(name,)).get() == "ran"
    (hold,) = finished(exporter, "lock.hold")
    assert [event.name for event in hold.events] == ["lock.lost"]
    assert hold.attributes["lock.lost"] is True
    assert hold.status.status_code.name == "ERROR"


def test_spans_only_for_the_apps_installed(
    eager: tuple[Celery, InMemorySpanExporter], obs_redis: RedisServer, name: str
) -> None:
    """``install(app)`` traces that app's tasks only; ``uninstall(app)`` stops it."""
    app, exporter = eager
    other = Celery("eager_other", broker=obs_redis.url)
    other.conf.update(task_always_eager=True, singleton_lock_url=obs_redis.url)

    @other.task(name="eager.other", base=LockedTask, lock_keys=["name"])
    def elsewhere(name: str) -> str:
        return "ran"

    @app.task(name="eager.mine", base=LockedTask, lock_keys=["name"])
    def mine(name: str) -> str:
        return "ran"

    assert elsewhere.apply(args=(name,)).get() == "ran"
    assert mine.apply(args=(name,)).get() == "ran"
    traced = {
        (span.attributes or {}).get("celery.task_name") for span in exporter.get_finished_spans()
    }
    assert traced == {"eager.mine"}
    otel.uninstall(app)
    exporter.clear()
    assert mine.apply(args=(name,)).get() == "ran"
    assert exporter.get_finished_spans() == ()


def test_the_producers_outcomes_are_one_span_each(
    eager: tuple[Celery, InMemorySpanExporter], name: str
) -> None:
    """The signals a producer sends for a call that publishes nothing: a queue-scope
    duplicate (``skipped``), a follow-up (``coalesced``) and a replacement (the
    ``lock_conflict`` of ``replace`` and its ``lock_superseded`` make one ``superseded``
    span), each a span of its own under the caller's current span."""
    app, exporter = eager

    @app.task(name="eager.queued", base=LockedTask, lock_keys=["name"], lock_scope="queue")
    def queued(name: str) -> str:
        return "ran"

    key = queued.lock_key(name)
    conflict, coalesced, superseded = (
        signals.lock_conflict,
        signals.lock_coalesced,
        signals.lock_superseded,
    )
    conflict.send(sender=queued, key=key, task_id=None, holder_task_id="h1", policy="skip",
                  scope="queue")  # fmt: skip
    conflict.send(sender=queued, key=key, task_id=None, holder_task_id=None, policy="coalesce",
                  scope="queue")  # fmt: skip
    coalesced.send(sender=queued, key=key, task_id="f1", scope="queue")
    conflict.send(sender=queued, key=key, task_id=None, holder_task_id="old", policy="replace",
                  scope="queue")  # fmt: skip
    superseded.send(sender=queued, key=key, task_id="old", by="new", running=False)
    outcomes = [
        (span.attributes or {}).get("lock.outcome") for span in finished(exporter, "lock.acquire")
    ]
    assert outcomes == ["skipped", "coalesced", "superseded"]
    skipped, followed, replaced = finished(exporter, "lock.acquire")
    assert (skipped.attributes or {}).get("lock.holder_task_id") == "h1"
    assert (followed.attributes or {}).get("celery.task_id") == "f1"
    assert (replaced.attributes or {}).get("lock.superseded_by") == "new"
