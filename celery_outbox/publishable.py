"""Whether a stored row can be published at all: the sweeper's check before it publishes.

A row naming a task this app does not know, or holding a payload that cannot be decoded
(or that the app's ``accept_content`` or ``outbox_max_payload_bytes`` refuses), would fail
on every attempt: the relay fails it for good at once instead of retrying it.
"""

from __future__ import annotations

from collections.abc import Collection, Container, Iterable

from celery import Celery

from celery_outbox.envelope import decode_body
from celery_outbox.exceptions import PayloadError
from celery_outbox.producers import describe
from celery_outbox.records import StoredMessage


def refusal(app: Celery, message: StoredMessage, *, max_payload_bytes: int | None) -> str | None:
    """Why no retry can publish ``message`` (an error text for the row), or ``None``."""
    return _refusal(app.tasks, app.conf.accept_content, message, max_payload_bytes)


def sort_out(
    app: Celery, messages: Iterable[StoredMessage], *, max_payload_bytes: int | None
) -> tuple[list[StoredMessage], dict[int, str]]:
    """``messages`` split into those that can be published and, by id, why the others cannot."""
    # Read once per batch, not per row: a lookup in Celery's settings costs about a third
    # of a row's check.
    tasks, accept = app.tasks, app.conf.accept_content
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
    try:
        decode_body(message.payload, message.options, accept=accept, max_bytes=max_payload_bytes)
    except PayloadError as exc:
        return f"payload refused: {exc}"
    except Exception as exc:  # noqa: BLE001 - any decoding error: the row is unpublishable
        return f"payload cannot be decoded: {describe(exc)}"
    return None
