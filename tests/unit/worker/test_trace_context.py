"""The worker's side of the trace context (:mod:`celery_outbox.tracing`): an attempt keeps
the context it was delivered with; its retries (ETA or parked) and its dead letter carry
the running span's context, or that one when no span is current.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from celery import Celery
from celery.app.task import Context
from celery.exceptions import Retry
from opentelemetry import trace

from celery_outbox import OutboxTask
from celery_outbox.dead_letters import TRACE_OPTION
from celery_outbox.registry import install_store
from celery_outbox.testing import InMemoryOutboxStore
from celery_outbox.worker.attempt import attempt_from_request
from celery_outbox.worker.letters import write_dead_letter
from celery_outbox.worker.policy import Outcome
from celery_outbox.worker.republish import schedule_retry
from tests.spans import memory_exporter
from tests.unit.worker.support import TASK, attempt_of, queued

NOW = datetime.now(timezone.utc)
#: A W3C trace context as a dispatch in another process stored it.
DELIVERED = {"traceparent": "00-" + "a1" * 16 + "-" + "b2" * 8 + "-01"}
tracer = trace.get_tracer("tests.unit.worker.test_trace_context")


def ids(traceparent: str) -> tuple[str, str]:
    """``(trace id, span id)`` of a W3C ``traceparent``."""
    return (traceparent.split("-")[1], traceparent.split("-")[2])


def hex16(span: Any) -> str:
    return f"{span.get_span_context().span_id:016x}"


def test_an_attempt_keeps_the_trace_context_it_was_delivered_with(app: Celery) -> None:
    request = Context(id="t1", args=[1], kwargs={}, delivery_info={}, **DELIVERED)

    attempt = attempt_from_request(app.tasks[TASK], request)

    assert attempt.trace == DELIVERED


def test_an_attempt_delivered_without_one_has_none(app: Celery) -> None:
    attempt = attempt_from_request(app.tasks[TASK], Context(id="t1", args=[1], delivery_info={}))

    assert attempt.trace == {}


@pytest.mark.parametrize("park", [False, True], ids=["eta", "parked"])
def test_a_retry_outside_any_span_carries_the_delivered_context(
    app: Celery, queue_name: str, park: bool
) -> None:
    spans = memory_exporter()
    store = InMemoryOutboxStore()
    install_store(app, store)
    attempt = replace(attempt_of("t2", queue_name), trace=DELIVERED)

    retry = schedule_retry(
        app.tasks[TASK], attempt, ValueError(), delay=timedelta(minutes=1), park=park, now=NOW
    )

    assert isinstance(retry, Retry)
    if park:  # stored as delivered, for the sweeper to publish
        (row,) = store.rows.values()
        assert row.options["headers"]["traceparent"] == DELIVERED["traceparent"]
    else:  # published at once, in a publish span that is a child of the delivered context
        (headers,) = queued(queue_name)
        (publish,) = spans.get_finished_spans()
        assert publish.parent is not None
        assert ids(headers["traceparent"]) == (f"{publish.context.trace_id:032x}", hex16(publish))
        assert ids(DELIVERED["traceparent"]) == (
            f"{publish.context.trace_id:032x}",
            f"{publish.parent.span_id:016x}",
        )


def test_a_retry_inside_the_tasks_span_continues_that_span(app: Celery, queue_name: str) -> None:
    spans = memory_exporter()
    install_store(app, InMemoryOutboxStore())
    attempt = replace(attempt_of("t3", queue_name), trace=DELIVERED)

    with tracer.start_as_current_span("run") as run:
        schedule_retry(
            app.tasks[TASK], attempt, ValueError(), delay=timedelta(0), park=False, now=NOW
        )

    (headers,) = queued(queue_name)
    # Published inside the span that dispatched it: an event on that span, no span of its own.
    assert [s.name for s in spans.get_finished_spans()] == ["run"]
    (event,) = [e for e in run.events if e.name == "celery_outbox.publish"]
    assert (event.attributes or {})["celery_outbox.path"] == "eta"
    assert ids(headers["traceparent"]) == (
        f"{run.get_span_context().trace_id:032x}",
        hex16(run),
    )


@pytest.mark.parametrize("in_span", [False, True], ids=["delivered", "running-span"])
def test_a_dead_letter_keeps_the_trace_of_the_run_that_failed(
    app: Celery, queue_name: str, in_span: bool
) -> None:
    memory_exporter()
    store = InMemoryOutboxStore()
    install_store(app, store)
    attempt = replace(attempt_of("t4", queue_name), trace=DELIVERED)
    expected = ids(DELIVERED["traceparent"])

    def write() -> int | None:
        return write_dead_letter(
            app.tasks[TASK], attempt, ValueError("boom"), outcome=Outcome.EXHAUSTED, now=NOW
        )

    if in_span:
        with tracer.start_as_current_span("run") as run:
            letter_id = write()
        expected = (f"{run.get_span_context().trace_id:032x}", hex16(run))
    else:
        letter_id = write()

    assert letter_id is not None
    letter = store.get_dead_letter(letter_id)
    assert letter is not None
    assert set(letter.options[TRACE_OPTION]) == {"traceparent"}
    assert ids(letter.options[TRACE_OPTION]["traceparent"]) == expected


def test_a_task_of_an_untraced_dispatch_leaves_no_trace_in_its_letter(app: Celery) -> None:
    memory_exporter()
    store = InMemoryOutboxStore()
    install_store(app, store)
    task: OutboxTask = app.tasks[TASK]  # type: ignore[assignment]

    letter_id = write_dead_letter(
        task, attempt_of("t5", "q"), ValueError("boom"), outcome=Outcome.EXHAUSTED, now=NOW
    )

    assert letter_id is not None
    letter = store.get_dead_letter(letter_id)
    assert letter is not None
    assert TRACE_OPTION not in letter.options
