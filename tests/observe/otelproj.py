"""The Celery app the tracing tests run in a real ``celery worker``, traced as a user would
trace it: OpenTelemetry's SDK and ``opentelemetry-instrumentation-celery`` set up in each
pool process (``worker_process_init``), and the lock spans installed with
``celery_singleton_lock.otel.install(app)``.

Configured from the environment: ``CSL_OBS_URL`` is broker, result backend and lock Redis
(the observability tests' private server); ``CSL_OTEL_SPANS`` names a directory where every
pool process writes the spans it finishes, one JSON object a line, in a file of its own
(``spans-<pid>.jsonl``), for the test to read.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from celery import Celery
from celery.signals import worker_process_init
from opentelemetry import trace
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from celery_singleton_lock import LockedTask, otel

URL = os.environ.get("CSL_OBS_URL", "redis://127.0.0.1:6399/0")

app = Celery("otelproj", broker=URL, backend=URL)
app.conf.update(
    singleton_lock_url=URL,
    singleton_lock_prefix="otel",
    task_default_queue="csl-otel",
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    result_expires=600,
)

otel.install(app)  # the global tracer provider, set in each pool process below


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """One finished span as a JSON-able dict (ids in hex, times in ns since the epoch)."""
    context = span.get_span_context()
    assert context is not None
    return {
        "name": span.name,
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent_id": f"{span.parent.span_id:016x}" if span.parent is not None else None,
        "kind": span.kind.name,
        "start": span.start_time,
        "end": span.end_time,
        "status": span.status.status_code.name,
        "attributes": dict(span.attributes or {}),
        "events": [
            {"name": event.name, "at": event.timestamp, "attributes": dict(event.attributes or {})}
            for event in span.events
        ],
        "pid": os.getpid(),
    }


class JsonLinesExporter(SpanExporter):
    """Appends each finished span to ``<directory>/spans-<pid>.jsonl`` as one JSON line."""

    def __init__(self, directory: str) -> None:
        self.path = Path(directory) / f"spans-{os.getpid()}.jsonl"
        self.guard = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(span_record(span), default=str) + "\n" for span in spans)
        with self.guard, self.path.open("a", encoding="utf-8") as out:
            out.write(lines)
        return SpanExportResult.SUCCESS


@worker_process_init.connect(weak=False)
def _trace_this_process(**_: Any) -> None:
    """As opentelemetry-instrumentation-celery asks: set up tracing in each pool process."""
    directory = os.environ.get("CSL_OTEL_SPANS")
    if not directory:
        return
    provider = TracerProvider(resource=Resource.create({"service.name": "otelproj-worker"}))
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(directory)))
    trace.set_tracer_provider(provider)
    CeleryInstrumentor().instrument(tracer_provider=provider)  # type: ignore[no-untyped-call]


@app.task(name="otel.waiter", base=LockedTask, lock_keys=["name"], lock_on_conflict="wait")
def waiter(name: str, seconds: float) -> str:
    """Policy wait: a duplicate waits for the holder."""
    time.sleep(seconds)
    return "ran"


@app.task(name="otel.job", base=LockedTask, lock_keys=["name"])
def job(name: str, seconds: float) -> str:
    """Default policy (skip): a duplicate is skipped."""
    time.sleep(seconds)
    return "ran"


@app.task(name="otel.parked", base=LockedTask, lock_keys=["name"], lock_on_conflict="park")
def parked(name: str, seconds: float) -> str:
    """Policy park: a duplicate waits in the key's park queue, outside the worker."""
    time.sleep(seconds)
    return "ran"


@app.task(
    name="otel.limited",
    base=LockedTask,
    lock_keys=["name", "part"],
    lock_on_conflict="park",
    lock_limits=[("otel-limited:{name}", 1)],
)
def limited(name: str, part: int, seconds: float) -> str:
    """Policy park under a stacked limit of one: a call of another part (its key free)
    is held back while one runs, and parked until the limit has room."""
    time.sleep(seconds)
    return "ran"


@app.task(name="otel.paced", base=LockedTask, lock_keys=["name"], lock_rate_limit="1/m")
def paced(name: str) -> str:
    """One start per key a minute: a second run within the minute is throttled (skip)."""
    return "ran"


@app.task(name="otel.renewed", base=LockedTask, lock_keys=["name"], lock_timeout=0.6)
def renewed(name: str, seconds: float) -> str:
    """A body that outlives its 0.6 s lease, renewed every 0.2 s meanwhile."""
    time.sleep(seconds)
    return "ran"
