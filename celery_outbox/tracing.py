"""The trace context of a dispatch, carried through the outbox (OpenTelemetry, optional).

When ``opentelemetry-api`` is installed, a dispatch stores the trace context current
at the call (the request's span) in the message headers it writes with the row
(:func:`with_context`); whoever publishes the row later, in whatever process (the
on-commit publisher, the sweeper, the relay, a worker's retry), publishes it inside a
``celery_outbox.publish`` span that is a child of that stored context and hands the
span on in the headers (:func:`publishing`). ``opentelemetry-instrumentation-celery``
extracts those headers in the worker, so the task's span joins the request's trace.
A requeued dead letter is dispatched with the failed run's context made current again
(:func:`attached`). A pipelined batch of rows that share one stored context (the rows of
one transaction) is published in one span (:func:`publishing_batch`), as OpenTelemetry's
messaging conventions describe a batch send.

A publish made inside the very span that dispatched the row (a request's on-commit
publish) is a ``celery_outbox.publish`` *event* on that span, with the same attributes,
and the message carries that span's context: an SDK span costs such a request ~0.1 ms
(``docs/benchmarks.md`` §16). A publish made later or elsewhere has its own span.

Headers are written and read with the globally configured propagator (W3C Trace
Context and Baggage unless ``OTEL_PROPAGATORS`` says otherwise), as the Celery
instrumentation does. Without ``opentelemetry-api`` every function here returns at
once and nothing is imported.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
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
#: Span attribute: the path that published the message
#: (:data:`~celery_outbox.relay.relay.PublishPath`).
PATH_ATTRIBUTE = "celery_outbox.path"
#: Span attribute: seconds from the row's due time (its dispatch, or the ETA of a parked
#: row) to this publish.
WAIT_ATTRIBUTE = "celery_outbox.wait_seconds"
#: Span attribute: the task's name (the Celery instrumentation's key).
TASK_NAME_ATTRIBUTE = "celery.task_name"
#: Span attribute: the task id (OpenTelemetry's messaging convention).
MESSAGE_ID_ATTRIBUTE = "messaging.message.id"
#: Span attribute of a batch's span: how many messages it published (the same convention).
BATCH_COUNT_ATTRIBUTE = "messaging.batch.message_count"

_NO_SPAN: AbstractContextManager[None] = nullcontext()


def fields() -> frozenset[str]:
    """The header names the configured propagator writes (empty without OpenTelemetry)."""
    if not ENABLED:
        return frozenset()
    global _FIELDS
    textmap = propagate.get_global_textmap()
    if _FIELDS is None or _FIELDS[0] is not textmap:
        _FIELDS = (textmap, frozenset(textmap.fields))
    return _FIELDS[1]


def current_headers() -> dict[str, str]:
    """The current trace context as message headers; empty when no valid span is current
    (or OpenTelemetry is not installed).

    The headers of the last context seen are kept: a request dispatching many tasks in
    one span injects once (a context is immutable; a new span or baggage is a new one).
    """
    if not ENABLED:
        return {}
    global _LAST_HEADERS
    current = otel_context.get_current()
    textmap = propagate.get_global_textmap()
    last = _LAST_HEADERS
    if last is not None and last[0] is current and last[1] is textmap:
        return dict(last[2])
    headers: dict[str, str] = {}
    if trace.get_current_span(current).get_span_context().is_valid:
        propagate.inject(headers, context=current)
    _LAST_HEADERS = (current, textmap, dict(headers))
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
    dispatches in the trace of the run that failed). Without one, nothing changes.
    """
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
    """The span of one publish, as a child of the trace context stored in ``headers``
    (the copy about to be published, updated in place to carry the span's own context, so
    the worker's span is its child); an event instead inside the span that dispatched it.

    ``path`` is how it is published (``commit``, ``sweep``, ``relay``, ``now``, ``eta``);
    the span records the wait since ``due`` (``available_at``) by ``clock`` (aware UTC).
    A message stored without a trace context is published without a span.
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
    parent = _parent(stored)
    dispatcher = _dispatching_span(parent)
    if dispatcher is not None:
        return _publish_event(dispatcher, attributes)
    return _publish_span(headers, parent, attributes)


@contextmanager
def publishing_batch(
    messages: Sequence[tuple[dict[str, Any], datetime, str]],
    *,
    path: str,
    clock: Callable[[], datetime],
) -> Iterator[list[bool]]:
    """One span around a pipelined batch, per trace context two or more of ``messages``
    share (each ``(headers, due, task_name)``).

    The headers of those messages are updated in place to carry their batch span; the
    list yielded says, per message, whether it has one (the others go to
    :func:`publishing`). The spans end when the block does (after the pipeline's flush);
    an error is recorded on each. Attributes: the path, the longest wait of the rows,
    their number, and the task name when they share one. Inside the span that dispatched
    them, that span gets an event with those attributes instead (headers left as they are).
    """
    covered = [False] * len(messages)
    groups: dict[tuple[tuple[str, str], ...], list[int]] = {}
    if ENABLED:
        for index, (headers, _, _) in enumerate(messages):
            stored = trace_headers(headers)
            if stored:
                groups.setdefault(tuple(sorted(stored.items())), []).append(index)
    spans = []
    dispatchers = []
    now = clock() if groups else None
    for key, members in groups.items():
        if len(members) < 2:
            continue
        names = {messages[i][2] for i in members}
        waits = [(now - messages[i][1]).total_seconds() for i in members] if now else [0.0]
        attributes: dict[str, str | float | int] = {
            PATH_ATTRIBUTE: path,
            WAIT_ATTRIBUTE: max(max(waits), 0.0),
            BATCH_COUNT_ATTRIBUTE: len(members),
        }
        if len(names) == 1:
            attributes[TASK_NAME_ATTRIBUTE] = next(iter(names))
        parent = _parent(dict(key))
        carried: dict[str, Any] = {}
        dispatcher = _dispatching_span(parent)
        if dispatcher is not None:  # the headers already carry its context
            dispatcher.add_event(PUBLISH_SPAN, attributes)
            dispatchers.append(dispatcher)
        else:
            span = _tracer().start_span(
                PUBLISH_SPAN, context=parent, kind=trace.SpanKind.PRODUCER, attributes=attributes
            )
            spans.append(span)
            if span.get_span_context().is_valid:
                propagate.inject(carried, context=trace.set_span_in_context(span, parent))
        for i in members:
            messages[i][0].update(carried)
            covered[i] = True
    try:
        yield covered
    except BaseException as exc:
        for span in spans:
            span.record_exception(exc)
            span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)))
        for dispatcher in dispatchers:  # recorded, not an error of the dispatching span
            dispatcher.record_exception(exc, attributes={PATH_ATTRIBUTE: path})
        raise
    finally:
        for span in spans:
            span.end()


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


@contextmanager
def _publish_event(dispatcher: Any, attributes: dict[str, str | float]) -> Iterator[None]:
    # An error is an exception event on the dispatching span, not its status: the row is
    # safe in the outbox, and the operation itself did not fail.
    dispatcher.add_event(PUBLISH_SPAN, attributes)
    try:
        yield
    except BaseException as exc:
        dispatcher.record_exception(exc, attributes={PATH_ATTRIBUTE: attributes[PATH_ATTRIBUTE]})
        raise


def _dispatching_span(parent: Any) -> Any:
    """The current span if it records and is the one ``parent`` (a stored context) names."""
    current = trace.get_current_span()
    if not current.is_recording():
        return None
    mine = current.get_span_context()
    stored = trace.get_current_span(parent).get_span_context()
    if mine.span_id != stored.span_id or mine.trace_id != stored.trace_id:
        return None
    return current


def _parent(stored: Mapping[str, str]) -> Any:
    """The context ``stored`` (trace headers) describes, by the configured propagator; the
    last one is kept (rows of one request or batch share one; a context is immutable).
    """
    global _LAST_PARENT
    key = tuple(stored.items())
    textmap = propagate.get_global_textmap()
    last = _LAST_PARENT
    if last is not None and last[0] == key and last[1] is textmap:
        return last[2]
    parent = propagate.extract(stored)
    _LAST_PARENT = (key, textmap, parent)
    return parent


def _tracer() -> Any:
    """This module's tracer (a proxy until a tracer provider is set, then that one's)."""
    global _TRACER
    if _TRACER is None:
        _TRACER = trace.get_tracer(__name__)
    return _TRACER


_TRACER: Any = None
#: The propagator :func:`fields` read last, and its fields.
_FIELDS: tuple[Any, frozenset[str]] | None = None
#: The context :func:`current_headers` saw last (held, so never another object at its
#: address), the propagator it used, and the headers it wrote.
_LAST_HEADERS: tuple[Any, Any, dict[str, str]] | None = None
#: The trace headers :func:`_parent` extracted last, the propagator, and their context.
_LAST_PARENT: tuple[tuple[tuple[str, str], ...], Any, Any] | None = None
