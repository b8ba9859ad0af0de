"""A part published at once (pipelined on Redis, confirmed with one wait on RabbitMQ) is
published in one span per trace context its rows share (OpenTelemetry's batch send), and
a dispatch injects the current context once per span.

Over real Redis and RabbitMQ with the SDK's in-memory exporter; the per-row spans and
every publish path on a real worker are in ``test_tracing.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from celery import Celery
from kombu import Connection
from opentelemetry import baggage, trace
from opentelemetry import context as otel_context

from celery_outbox import OutboxTask, tracing
from celery_outbox.publishing.broker import Confirms
from celery_outbox.publishing.producers import Producers
from celery_outbox.state import reset
from celery_outbox.store.records import NewMessage, StoredMessage
from tests.brokers import celery_queue
from tests.messages import NOW, numbered
from tests.spans import memory_exporter

TASK = "integration.tracing_batches.noop"
tracer = trace.get_tracer("tests.integration.test_tracing_batches")


@pytest.fixture
def app(broker_url: str, broker_queue: str) -> Iterator[Celery]:
    app = Celery("tracing-batches", broker=broker_url, set_as_current=False)
    app.conf.task_default_queue = broker_queue

    @app.task(base=OutboxTask, name=TASK, shared=False)
    def noop(n: int) -> int:
        return n

    yield app
    reset(app)
    app.close()


def dispatched(app: Celery, n: int, *, due: datetime = NOW) -> NewMessage:
    """The message of ``noop(n)``, id ``t-{n}``, built at ``due``."""
    return numbered(app.tasks[TASK], n, task_id=f"t-{n}", now=due)


def send(app: Celery, messages: list[NewMessage], clock: Any = lambda: NOW) -> list[int]:
    sender = Producers(app, timeout=timedelta(seconds=5), batch_bytes=1 << 20, clock=clock)
    assert sender.batch_publish
    try:
        sent = sender.send(
            [StoredMessage.written(m, i + 1) for i, m in enumerate(messages)], path="commit"
        )
    finally:
        sender.close()
    return sent.published


def queued(broker_url: str, queue: str) -> dict[str, dict[str, Any]]:
    with Connection(broker_url) as conn:
        bound = celery_queue(queue)(conn.default_channel)
        found = {}
        while (message := bound.get(no_ack=True)) is not None:
            found[message.headers["id"]] = message.headers
        return found


def span_id_of(traceparent: str) -> str:
    return traceparent.split("-")[2]


def hex_ids(span: Any) -> tuple[str, str]:
    context = span.get_span_context()
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


def test_rows_sharing_a_context_are_published_in_one_span_the_others_each_in_their_own(
    app: Celery, broker_url: str, broker_queue: str
) -> None:
    spans = memory_exporter()
    with tracer.start_as_current_span("request a") as a:
        first = [dispatched(app, n, due=NOW - timedelta(seconds=n)) for n in (1, 2, 3)]
    with tracer.start_as_current_span("request b") as b:
        second = [dispatched(app, n) for n in (4, 5)]
    with tracer.start_as_current_span("request c") as c:
        alone = dispatched(app, 6)
    untraced = dispatched(app, 7)

    published = send(app, [*first, second[0], alone, second[1], untraced])

    assert sorted(published) == [1, 2, 3, 4, 5, 6, 7]
    publishes = [s for s in spans.get_finished_spans() if s.name == tracing.PUBLISH_SPAN]
    by_trace = {f"{s.context.trace_id:032x}": s for s in publishes}
    assert len(publishes) == 3
    assert len(by_trace) == 3
    batch_a, batch_b = by_trace[hex_ids(a)[0]], by_trace[hex_ids(b)[0]]
    single = by_trace[hex_ids(c)[0]]
    assert dict(batch_a.attributes or {}) == {
        tracing.PATH_ATTRIBUTE: "commit",
        tracing.WAIT_ATTRIBUTE: 3.0,  # the longest wait of its rows
        tracing.BATCH_COUNT_ATTRIBUTE: 3,
        tracing.TASK_NAME_ATTRIBUTE: TASK,
    }
    assert (batch_a.parent.span_id, batch_b.parent.span_id) == (
        a.get_span_context().span_id,
        b.get_span_context().span_id,
    )
    assert (batch_b.attributes or {})[tracing.BATCH_COUNT_ATTRIBUTE] == 2
    assert (single.attributes or {})[tracing.MESSAGE_ID_ATTRIBUTE] == "t-6"
    headers = queued(broker_url, broker_queue)
    parents = {
        task_id: span_id_of(h["traceparent"])
        for task_id, h in headers.items()
        if "traceparent" in h
    }
    assert parents == {
        "t-1": hex_ids(batch_a)[1],
        "t-2": hex_ids(batch_a)[1],
        "t-3": hex_ids(batch_a)[1],
        "t-4": hex_ids(batch_b)[1],
        "t-5": hex_ids(batch_b)[1],
        "t-6": hex_ids(single)[1],
    }
    assert "traceparent" not in headers["t-7"]


def test_a_batch_published_inside_the_span_that_dispatched_it_is_one_event_on_it(
    app: Celery, broker_url: str, broker_queue: str
) -> None:
    spans = memory_exporter()

    with tracer.start_as_current_span("request") as request:  # an on-commit publish
        published = send(app, [dispatched(app, n) for n in (1, 2, 3)])

    assert sorted(published) == [1, 2, 3]
    assert [s.name for s in spans.get_finished_spans()] == ["request"]  # no publish span
    (event,) = request.events
    assert event.name == tracing.PUBLISH_SPAN
    assert (event.attributes or {})[tracing.BATCH_COUNT_ATTRIBUTE] == 3
    parents = {t: span_id_of(h["traceparent"]) for t, h in queued(broker_url, broker_queue).items()}
    assert parents == dict.fromkeys(("t-1", "t-2", "t-3"), hex_ids(request)[1])


def test_a_batch_whose_pipeline_fails_records_the_error_and_each_row_is_sent_again(
    app: Celery, broker_url: str, broker_queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    spans = memory_exporter()
    with tracer.start_as_current_span("request"):
        messages = [dispatched(app, n) for n in (1, 2)]

    def failing(*args: Any) -> None:
        raise ConnectionError("the pipeline (Redis) or the confirms (RabbitMQ) were lost")

    if broker_url.startswith("redis"):  # the part's pipeline fails as it is sent
        from contextlib import contextmanager

        from celery_outbox.publishing.redis import RedisPush

        @contextmanager
        def lost(self: RedisPush) -> Iterator[None]:
            yield
            failing()

        monkeypatch.setattr(RedisPush, "pushing", lost)
    else:
        monkeypatch.setattr(Confirms, "wait", failing)

    published = send(app, messages)

    assert sorted(published) == [1, 2]  # row by row, after the batch failed
    publishes = [s for s in spans.get_finished_spans() if s.name == tracing.PUBLISH_SPAN]
    failed = [s for s in publishes if (s.attributes or {}).get(tracing.BATCH_COUNT_ATTRIBUTE)]
    assert [s.status.status_code.name for s in failed] == ["ERROR"]
    singles = [s for s in publishes if (s.attributes or {}).get(tracing.MESSAGE_ID_ATTRIBUTE)]
    again = sorted((s.attributes or {})[tracing.MESSAGE_ID_ATTRIBUTE] for s in singles)
    if broker_url.startswith("redis"):
        assert again == ["t-1", "t-2"]
    else:  # the rows whose confirm arrived before the wait failed are published already
        assert set(again) <= {"t-1", "t-2"}
    assert set(queued(broker_url, broker_queue)) == {"t-1", "t-2"}


def test_a_dispatch_injects_the_current_context_and_follows_it_when_it_changes() -> None:
    memory_exporter()
    with tracer.start_as_current_span("one") as one:
        first, again = tracing.current_headers(), tracing.current_headers()
        first["mutated"] = "by the caller"
        token = otel_context.attach(baggage.set_baggage("tenant", "42"))
        try:
            with_baggage = tracing.current_headers()
        finally:
            otel_context.detach(token)
    with tracer.start_as_current_span("two") as two:
        second = tracing.current_headers()
    outside = tracing.current_headers()

    assert span_id_of(again["traceparent"]) == hex_ids(one)[1]
    assert "mutated" not in again
    assert with_baggage["baggage"] == "tenant=42"
    assert "baggage" not in again
    assert span_id_of(second["traceparent"]) == hex_ids(two)[1]
    assert outside == {}
