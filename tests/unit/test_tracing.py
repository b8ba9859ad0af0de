"""The trace context carried through the outbox (:mod:`celery_outbox.tracing`): stored at
dispatch, re-attached at publish in a ``celery_outbox.publish`` span, rejoined by a
requeue. Over OpenTelemetry's SDK with its in-memory exporter, kombu's memory broker and
the in-memory store; real workers on every path are in ``tests/integration/test_tracing.py``.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from celery import Celery
from kombu import Connection, Queue
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode

from celery_outbox import OutboxTask, tracing
from celery_outbox.config import OutboxConfig
from celery_outbox.dead_letters import TRACE_OPTION, build_dead_letter, requeue
from celery_outbox.dispatch.envelope import build_message
from celery_outbox.publishing.producers import Producers
from celery_outbox.registry import install_store
from celery_outbox.relay.relay import relay_for
from celery_outbox.relay.sweeper import Sweeper
from celery_outbox.state import reset
from celery_outbox.store.records import NewMessage, StoredMessage
from celery_outbox.testing import InMemoryOutboxStore
from tests.spans import memory_exporter
from tests.worker import REPO_ROOT

NOW = datetime(2030, 1, 1, tzinfo=timezone.utc)
TASK = "unit.tracing.noop"
tracer = trace.get_tracer("tests.unit.test_tracing")


@pytest.fixture
def store() -> InMemoryOutboxStore:
    return InMemoryOutboxStore()


@pytest.fixture
def app(queue_name: str, store: InMemoryOutboxStore) -> Iterator[Celery]:
    app = Celery("tracing-unit", broker="memory://", set_as_current=False)
    app.conf.task_default_queue = queue_name

    @app.task(base=OutboxTask, name=TASK, shared=False)
    def noop(n: int) -> int:
        return n

    install_store(app, store)
    yield app
    reset(app)
    app.close()


def dispatched(app: Celery, now: datetime = NOW, **options: Any) -> NewMessage:
    return build_message(
        app.tasks[TASK],
        (1,),
        {},
        task_id="t-1",
        options=options,
        now=now,
        park_after=timedelta(seconds=30),
        max_bytes=None,
    )


def parent_of(traceparent: str) -> tuple[str, str]:
    """``(trace id, parent span id)`` of a W3C ``traceparent`` header."""
    _version, trace_id, span_id, _flags = traceparent.split("-")
    return trace_id, span_id


def ids(span: Any) -> tuple[str, str]:
    context = span.get_span_context()
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


def queued_headers(queue_name: str) -> list[dict[str, Any]]:
    with Connection("memory://") as conn:
        queue = Queue(queue_name)(conn.default_channel)
        found = []
        while (message := queue.get(no_ack=True)) is not None:
            found.append(message.headers)
        return found


def producers(app: Celery, *, clock: Any = lambda: NOW, timeout: float = 5.0) -> Producers:
    return Producers(app, timeout=timedelta(seconds=timeout), batch_bytes=1 << 20, clock=clock)


# -- at dispatch ------------------------------------------------------------------------
def test_a_dispatch_outside_any_span_stores_no_trace_context(app: Celery) -> None:
    memory_exporter()

    headers = dispatched(app).options["headers"]

    assert "traceparent" not in headers


def test_a_dispatch_stores_the_trace_context_current_at_the_call(app: Celery) -> None:
    memory_exporter()
    with tracer.start_as_current_span("request") as request:
        message = dispatched(app)

    assert parent_of(message.options["headers"]["traceparent"]) == ids(request)


def test_a_span_current_at_the_call_replaces_a_context_the_headers_carried(app: Celery) -> None:
    memory_exporter()
    old = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"
    with tracer.start_as_current_span("retry") as current:
        message = dispatched(app, headers={"traceparent": old, "x": "kept"})

    assert parent_of(message.options["headers"]["traceparent"]) == ids(current)
    assert message.options["headers"]["x"] == "kept"


# -- at publish -------------------------------------------------------------------------
def test_the_publish_rejoins_the_stored_trace_in_a_span_of_its_own(
    app: Celery, queue_name: str
) -> None:
    spans = memory_exporter()
    with tracer.start_as_current_span("request") as request:
        message = dispatched(app)
    sender = producers(app, clock=lambda: NOW + timedelta(seconds=2.5))

    try:  # later, in no span: as the sweeper does
        sent = sender.send([StoredMessage.written(message, 1)], path="sweep")
    finally:
        sender.close()

    assert sent.published == [1]
    (publish,) = [s for s in spans.get_finished_spans() if s.name == tracing.PUBLISH_SPAN]
    assert publish.parent is not None
    assert (publish.context.trace_id, publish.parent.span_id) == (
        request.get_span_context().trace_id,
        request.get_span_context().span_id,
    )
    assert publish.kind is SpanKind.PRODUCER
    assert dict(publish.attributes or {}) == {
        tracing.PATH_ATTRIBUTE: "sweep",
        tracing.WAIT_ATTRIBUTE: 2.5,
        tracing.TASK_NAME_ATTRIBUTE: TASK,
        tracing.MESSAGE_ID_ATTRIBUTE: "t-1",
    }
    (headers,) = queued_headers(queue_name)  # the worker's span will be the publish's child
    assert parent_of(headers["traceparent"]) == ids(publish)
    assert message.options["headers"]["traceparent"] != headers["traceparent"]  # row untouched


def test_a_message_dispatched_in_no_trace_is_published_without_a_span(
    app: Celery, queue_name: str
) -> None:
    spans = memory_exporter()
    sender = producers(app)

    try:
        sender.publish_message(dispatched(app), path="eta")
    finally:
        sender.close()

    assert spans.get_finished_spans() == ()
    (headers,) = queued_headers(queue_name)
    assert "traceparent" not in headers


def test_a_publish_that_raises_ends_its_span_with_the_error(app: Celery) -> None:
    spans = memory_exporter()
    with tracer.start_as_current_span("request"):
        message = dispatched(app)
    options = {k: v for k, v in message.options.items() if k != "content_type"}
    sender = producers(app)

    try:
        with pytest.raises(KeyError):
            sender.publish_message(replace(message, options=options), path="eta")
    finally:
        sender.close()

    publish = spans.get_finished_spans()[-1]
    assert (publish.name, publish.status.status_code) == (tracing.PUBLISH_SPAN, StatusCode.ERROR)


def test_a_publish_inside_the_span_that_dispatched_it_is_an_event_on_that_span(
    app: Celery, queue_name: str
) -> None:
    spans = memory_exporter()
    sender = producers(app, clock=lambda: NOW + timedelta(seconds=0.25))

    try:
        with tracer.start_as_current_span("request") as request:  # an on-commit publish
            message = dispatched(app)
            sent = sender.send([StoredMessage.written(message, 1)], path="commit")
    finally:
        sender.close()

    assert sent.published == [1]
    assert [s.name for s in spans.get_finished_spans()] == ["request"]  # no span of its own
    (event,) = request.events
    assert event.name == tracing.PUBLISH_SPAN
    assert dict(event.attributes or {}) == {
        tracing.PATH_ATTRIBUTE: "commit",
        tracing.WAIT_ATTRIBUTE: 0.25,
        tracing.TASK_NAME_ATTRIBUTE: TASK,
        tracing.MESSAGE_ID_ATTRIBUTE: "t-1",
    }
    (headers,) = queued_headers(queue_name)  # the worker's span: the request's child
    assert parent_of(headers["traceparent"]) == ids(request)


def test_a_publish_inside_another_span_still_has_its_own(app: Celery, queue_name: str) -> None:
    spans = memory_exporter()
    with tracer.start_as_current_span("request"):
        message = dispatched(app)
    sender = producers(app)

    try:
        with tracer.start_as_current_span("a later operation") as later:
            sender.send([StoredMessage.written(message, 1)], path="commit")
    finally:
        sender.close()

    assert later.events == ()
    (publish,) = [s for s in spans.get_finished_spans() if s.name == tracing.PUBLISH_SPAN]
    (headers,) = queued_headers(queue_name)
    assert parent_of(headers["traceparent"]) == ids(publish)


def test_a_failed_publish_inside_its_dispatching_span_records_the_error_there(
    app: Celery,
) -> None:
    spans = memory_exporter()
    sender = producers(app)

    try:
        with tracer.start_as_current_span("request") as request:
            message = dispatched(app)
            options = {k: v for k, v in message.options.items() if k != "content_type"}
            with pytest.raises(KeyError):
                sender.publish_message(replace(message, options=options), path="now")
    finally:
        sender.close()

    assert [e.name for e in request.events] == [tracing.PUBLISH_SPAN, "exception"]
    assert (request.events[1].attributes or {})["exception.type"] == "KeyError"
    assert request.status.status_code is StatusCode.UNSET  # the request itself did not fail
    assert [s.name for s in spans.get_finished_spans()] == ["request"]


@pytest.mark.parametrize("entry", ["commit", "now", "sweep", "relay"])
def test_each_entry_point_names_itself_in_the_publish_span(
    app: Celery, store: InMemoryOutboxStore, queue_name: str, entry: str
) -> None:
    app.conf.outbox_publish_grace = 0.0  # the sweep takes the fresh row at once
    spans = memory_exporter()
    with tracer.start_as_current_span("request"):
        row_id = store.add(dispatched(app, datetime.now(timezone.utc)))  # not yet published
    assert row_id is not None
    relay = relay_for(app)
    row = store.rows[row_id]
    config = OutboxConfig.from_celery(app)
    sweeper = Sweeper(app=app, store=store, relay=relay, config=config)
    stop = threading.Event()
    try:
        if entry == "commit":
            relay.publish_committed([row])
        elif entry == "now":
            relay.publish_ids([row_id])
        elif entry == "sweep":
            sweeper.sweep()
        else:
            threading.Timer(0.5, stop.set).start()
            sweeper.run(stop, 0.05)
    finally:
        relay.close()

    (publish,) = [s for s in spans.get_finished_spans() if s.name == tracing.PUBLISH_SPAN]
    assert (publish.attributes or {})[tracing.PATH_ATTRIBUTE] == entry
    assert len(queued_headers(queue_name)) == 1


# -- attached (requeue) -----------------------------------------------------------------
def test_attached_makes_a_stored_context_current_then_restores_the_callers() -> None:
    memory_exporter()
    with tracer.start_as_current_span("failed run") as failed:
        stored = tracing.current_headers()
    with tracer.start_as_current_span("admin") as admin:
        with tracing.attached(stored):
            inside = trace.get_current_span().get_span_context()
        after = trace.get_current_span()

    assert (inside.trace_id, inside.span_id) == (
        failed.get_span_context().trace_id,
        failed.get_span_context().span_id,
    )
    assert after is admin


def test_a_requeue_dispatches_in_the_trace_of_the_run_that_failed(
    app: Celery, store: InMemoryOutboxStore, queue_name: str
) -> None:
    memory_exporter()
    with tracer.start_as_current_span("failed run") as failed:
        context = tracing.current_headers()
    letter_id = store.add_dead_letter(
        build_dead_letter(
            task_name=TASK,
            task_id="t-dead",
            args=[1],
            kwargs={},
            options={"queue": queue_name, TRACE_OPTION: context},
            exc=ValueError("boom"),
            retries=0,
            first_failed_at=NOW,
            failed_at=NOW,
        )
    )

    with tracer.start_as_current_span("admin request"):
        requeue(app, letter_id, by="ops")

    (headers,) = queued_headers(queue_name)
    trace_id, _publish_span = parent_of(headers["traceparent"])
    assert trace_id == ids(failed)[0]


# -- without OpenTelemetry --------------------------------------------------------------
WITHOUT_OTEL = """
import sys
sys.modules["opentelemetry"] = None
from datetime import datetime, timedelta, timezone
from celery import Celery
from celery_outbox import OutboxTask, tracing
from celery_outbox.dispatch.envelope import build_message
from celery_outbox.publishing.producers import Producers
from celery_outbox.store.records import StoredMessage
assert tracing.ENABLED is False and tracing.fields() == frozenset()
app = Celery("no-otel", broker="memory://", set_as_current=False)
def noop():
    pass
task = app.task(base=OutboxTask, name="no.otel", shared=False)(noop)
now = datetime.now(timezone.utc)
message = build_message(task, (), {}, task_id="t", options={"headers": {"traceparent": "kept"}},
                        now=now, park_after=timedelta(seconds=30), max_bytes=None)
assert message.options["headers"]["traceparent"] == "kept"
sent = Producers(app, timeout=timedelta(seconds=5), batch_bytes=1 << 20, clock=lambda: now).send(
    [StoredMessage.written(message, 1)], path="commit")
assert sent.published == [1], sent
print("ok")
"""


def test_without_opentelemetry_dispatch_and_publish_work_untouched() -> None:
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_OTEL],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert (result.returncode, result.stdout.strip()) == (0, "ok"), result.stderr


def test_with_the_celery_instrumentation_the_row_stores_its_apply_async_span(
    app: Celery,
) -> None:
    # Celery sends before_task_publish while the outbox captures the message at the call,
    # so an instrumented dispatching process stores its producer span, in the same trace.
    from opentelemetry.instrumentation.celery import CeleryInstrumentor

    spans = memory_exporter()
    instrumentor = CeleryInstrumentor()
    instrumentor.instrument()
    try:
        with tracer.start_as_current_span("request") as request:
            message = dispatched(app)
    finally:
        instrumentor.uninstrument()

    (apply_async,) = [s for s in spans.get_finished_spans() if s.name == f"apply_async/{TASK}"]
    assert apply_async.parent is not None
    assert apply_async.parent.span_id == request.get_span_context().span_id
    assert parent_of(message.options["headers"]["traceparent"]) == ids(apply_async)
