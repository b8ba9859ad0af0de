"""OpenTelemetry's SDK in a test process: spans kept in memory, or written to a file.

A process has one global tracer provider (OpenTelemetry refuses to replace it), so the
test process installs one, once, with an in-memory exporter (:func:`memory_exporter`),
and a worker process one that appends each span as a JSON line (:func:`export_to_file`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_memory: InMemorySpanExporter | None = None


def memory_exporter() -> InMemorySpanExporter:
    """This process's in-memory exporter (installed on first use), emptied."""
    global _memory
    if _memory is None:
        _memory = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_memory))
        trace.set_tracer_provider(provider)
    _memory.clear()
    return _memory


class JsonLinesExporter(SpanExporter):
    """Appends each finished span to ``path``, one JSON object a line (:func:`as_record`)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self.path.open("a") as out:
            for span in spans:
                out.write(json.dumps(as_record(span)) + "\n")
        return SpanExportResult.SUCCESS


def export_to_file(path: Path) -> None:
    """Install a tracer provider writing every span to ``path`` as it ends."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(path)))
    trace.set_tracer_provider(provider)


def as_record(span: ReadableSpan) -> dict[str, Any]:
    """A span as plain data: name, ids as hex, parent span id, attributes, events (each
    ``{"name", "attributes"}``).
    """
    context = span.get_span_context()
    assert context is not None
    return {
        "name": span.name,
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent_id": f"{span.parent.span_id:016x}" if span.parent else None,
        "attributes": dict(span.attributes or {}),
        "events": [
            {"name": event.name, "attributes": dict(event.attributes or {})}
            for event in span.events
        ],
    }


def read_records(path: Path) -> list[dict[str, Any]]:
    """The spans :class:`JsonLinesExporter` wrote to ``path`` so far."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
