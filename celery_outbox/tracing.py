"""The trace context of a dispatch, carried through the outbox (OpenTelemetry, optional).

When ``opentelemetry-api`` is installed, a dispatch stores the trace context current
at the call (the request's span) in the message headers it writes with the row
(:func:`with_context`); whoever publishes the row later, in whatever process (the
on-commit publisher, the sweeper, the relay, a worker's retry), publishes it inside a
``celery_outbox.publish`` span that is a child of that stored context and hands the
span on in the headers (:func:`publishing`). ``opentelemetry-instrumentation-celery``
extracts those headers in the worker, so the task's span joins the request's trace.
A requeued dead letter is dispatched with the failed run's context made current again
(:func:`attached`).

Headers are written and read with the globally configured propagator (W3C Trace
Context and Baggage unless ``OTEL_PROPAGATORS`` says otherwise), as the Celery
instrumentation does. Without ``opentelemetry-api`` every function here returns at
once and nothing is imported.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import datetime
from typing import Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
except ImportError:  # tracing is optional: without the API nothing here does anything
    ENABLED = False
else:
    ENABLED = True

#: Name of the span around the publish of one row (or of one retry from a worker).
PUBLISH_SPAN = "celery_outbox.publish"
#: Span attribute: the path that published the message (:data:`~celery_outbox.relay.PublishPath`).
PATH_ATTRIBUTE = "celery_outbox.path"
#: Span attribute: seconds from the row's due time (its dispatch, or the ETA of a parked
#: row) to this publish.
WAIT_ATTRIBUTE = "celery_outbox.wait_seconds"
#: Span attribute: the task's name (the Celery instrumentation's key).
TASK_NAME_ATTRIBUTE = "celery.task_name"
#: Span attribute: the task id (OpenTelemetry's messaging convention).
MESSAGE_ID_ATTRIBUTE = "messaging.message.id"

_NO_SPAN: AbstractContextManager[None] = nullcontext()


def fields() -> frozenset[str]:
    """The header names the configured propagator writes (empty without OpenTelemetry)."""
    if not ENABLED:
        return frozenset()
    return frozenset(propagate.get_global_textmap().fields)


def current_headers() -> dict[str, str]:
    """The current trace context as message headers; empty when no valid span is current
    (or OpenTelemetry is not installed)."""
    if not ENABLED or not trace.get_current_span().get_span_context().is_valid:
        return {}
    headers: dict[str, str] = {}
    propagate.inject(headers)
    return headers


def trace_headers(headers: Mapping[str, Any]) -> dict[str, str]:
    """The trace-context entries of ``headers`` (those the propagator writes)."""
    return {name: headers[name] for name in fields() if isinstance(headers.get(name), str)}


def with_context(options: Mapping[str, Any]) -> Mapping[str, Any]:
    """``apply_async`` options whose ``headers`` carry the current trace context.

    A valid current span replaces any trace context the headers already carry (a retry
    sent from inside the task's span continues that span); without one, ``options`` are
    returned unchanged.
    """
    context = current_headers()
    if not context:
        return options
    return {**options, "headers": {**(options.get("headers") or {}), **context}}


def attached(headers: Mapping[str, Any]) -> AbstractContextManager[None]:
    """Within it, the trace context stored in ``headers`` is the current one (a requeue
    dispatches in the trace of the run that failed). Without one, nothing changes."""
    stored = trace_headers(headers) if ENABLED else {}
    if not stored:
        return _NO_SPAN
    return _attached(stored)


@contextmanager
def _attached(stored: Mapping[str, str]) -> Iterator[None]:
    token = otel_context.attach(propagate.extract(stored))
    try:
        yield
    finally:
        otel_context.detach(token)


def publishing(
    headers: dict[str, Any],
    *,
    path: str,
    task_name: str,
    task_id: str,
    due: datetime,
    clock: Callable[[], datetime],
) -> AbstractContextManager[None]:
    """The span of one publish, as a child of the trace context stored in ``headers``.

    While it is open, ``headers`` (the copy about to be published) carry the publish
    span's own context, so the worker's span is its child. A message stored without a
    trace context is published without a span (it has no trace to join).

    Parameters
    ----------
    headers
        The message headers to publish; updated in place.
    path
        How the message is published (``commit``, ``sweep``, ``relay``, ``now``, ``eta``).
    due
        When the row became due (``available_at``): the span records the wait since.
    clock
        The current aware UTC time.
    """
    if not ENABLED:
        return _NO_SPAN
    stored = trace_headers(headers)
    if not stored:
        return _NO_SPAN
    attributes: dict[str, str | float] = {
        PATH_ATTRIBUTE: path,
        WAIT_ATTRIBUTE: max((clock() - due).total_seconds(), 0.0),
        TASK_NAME_ATTRIBUTE: task_name,
        MESSAGE_ID_ATTRIBUTE: task_id,
    }
    return _publish_span(headers, propagate.extract(stored), attributes)


@contextmanager
def _publish_span(
    headers: dict[str, Any], parent: Any, attributes: dict[str, str | float]
) -> Iterator[None]:
    # Not made current: only the message carries it (no context attach per publish).
    span = _tracer().start_span(
        PUBLISH_SPAN, context=parent, kind=trace.SpanKind.PRODUCER, attributes=attributes
    )
    try:
        if span.get_span_context().is_valid:
            propagate.inject(headers, context=trace.set_span_in_context(span, parent))
        yield
    except BaseException as exc:
        span.record_exception(exc)
        span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)))
        raise
    finally:
        span.end()


def _tracer() -> Any:
    """This module's tracer (a proxy until a tracer provider is set, then that one's)."""
    global _TRACER
    if _TRACER is None:
        _TRACER = trace.get_tracer(__name__)
    return _TRACER


_TRACER: Any = None
