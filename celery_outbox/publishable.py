"""Whether a stored row can be published at all: the sweeper's check before it publishes.

A row naming a task this app does not know, or holding a payload that cannot be decoded
(or that the app's ``accept_content`` or ``outbox_max_payload_bytes`` refuses), would fail
on every attempt: the relay fails it for good at once instead of retrying it.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Container, Iterable, Mapping
from typing import Any, cast

from celery import Celery
from kombu.exceptions import SerializerNotInstalled
from kombu.serialization import prepare_accept_content

from celery_outbox.envelope import BODY_ENCODING_BASE64, decode_body
from celery_outbox.exceptions import PayloadError
from celery_outbox.producers import describe
from celery_outbox.records import StoredMessage


def refusal(app: Celery, message: StoredMessage, *, max_payload_bytes: int | None) -> str | None:
    """Why no retry can publish ``message`` (an error text for the row), or ``None``."""
    return _refusal(app.tasks, _accepted(app), message, max_payload_bytes)


def sort_out(
    app: Celery, messages: Iterable[StoredMessage], *, max_payload_bytes: int | None
) -> tuple[list[StoredMessage], dict[int, str]]:
    """``messages`` split into those that can be published and, by id, why the others cannot."""
    # Read once per batch, not per row: a lookup in Celery's settings costs about a third
    # of a row's check.
    tasks, accept = app.tasks, _accepted(app)
    publishable: list[StoredMessage] = []
    refused: dict[int, str] = {}
    for message in messages:
        reason = _refusal(tasks, accept, message, max_payload_bytes)
        if reason is None:
            publishable.append(message)
        else:
            refused[message.id] = reason
    return publishable, refused


def _refusal(
    tasks: Container[str],
    accept: Collection[str] | None,
    message: StoredMessage,
    max_payload_bytes: int | None,
) -> str | None:
    if message.task_name not in tasks:
        return f"task {message.task_name!r} is not registered with this app"
    if accept is not None and JSON in accept and _plain_json(message.payload, message.options):
        return None
    try:
        decode_body(message.payload, message.options, accept=accept, max_bytes=max_payload_bytes)
    except PayloadError as exc:
        return f"payload refused: {exc}"
    except Exception as exc:  # noqa: BLE001 - any decoding error: the row is unpublishable
        return f"payload cannot be decoded: {describe(exc)}"
    return None


#: The content type of Celery's default serializer.
JSON = "application/json"


def _accepted(app: Celery) -> Collection[str] | None:
    # The content types the app accepts (Celery's default: JSON only), as decode_body
    # reads them; a serializer name kombu does not know is left for decode_body to name.
    accept = app.conf.accept_content
    try:
        return prepare_accept_content(accept or ["json"]) or set()
    except SerializerNotInstalled:
        return cast("Collection[str] | None", accept)


def _plain_json(payload: str, options: Mapping[str, Any]) -> bool:
    # Whether the payload is JSON text that kombu's decoder would return unchanged: its
    # hook only turns objects keyed "__type__" (which an escape can spell), so without
    # either one plain json.loads accepts exactly what it accepts, at a fraction of the
    # cost (the sweeper checks every row). Anything else, or an error, takes kombu's path.
    if options.get("content_type") != JSON or options.get("content_encoding") != "utf-8":
        return False
    if "compression" in options or options.get("body_encoding") == BODY_ENCODING_BASE64:
        return False
    if "__type__" in payload or "\\u" in payload:
        return False
    try:
        json.loads(payload)
    except ValueError:
        return False
    return True
