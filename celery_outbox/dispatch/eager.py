"""``OutboxTask`` under ``task_always_eager`` (users' test suites): the arguments are
checked at the call as a real dispatch checks them, and the task runs when the caller's
transaction commits (never after a rollback).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from celery import Task
from celery.result import AsyncResult

from celery_outbox.config import OutboxConfig
from celery_outbox.dispatch.envelope import serialise_body
from celery_outbox.dispatch.validation import check_argument_depth
from celery_outbox.registry import store_for


def apply_on_commit(
    task: Task[Any, Any],
    args: Sequence[Any] | None,
    kwargs: Mapping[str, Any] | None,
    task_id: str,
    options: dict[str, Any],
    using: str | None,
    config: OutboxConfig,
) -> AsyncResult[Any]:
    """Check the arguments now and run ``task`` eagerly once the transaction commits."""
    payload, content = serialise_body(
        task.name,
        (list(args or ()), dict(kwargs or {}), {}),
        serializer=options.get("serializer") or task.serializer or task.app.conf.task_serializer,
        compression=options.get("compression"),
        max_bytes=config.max_payload_bytes,
        accept=task.app.conf.accept_content,
    )
    check_argument_depth(
        task.name,
        tuple(args or ()),
        dict(kwargs or {}),
        payload=payload,
        content_type=content["content_type"],
    )
    outcome: list[AsyncResult[Any]] = []

    def run() -> None:
        outcome.append(
            Task.apply_async(
                task, tuple(args or ()), dict(kwargs or {}), task_id=task_id, **options
            )
        )

    store_for(task.app).on_commit(run, using=using)
    return outcome[0] if outcome else task.AsyncResult(task_id)
