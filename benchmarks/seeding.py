"""Pending outbox rows written fast (bulk INSERT), as if their publisher had died."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from kombu.utils.uuid import uuid


def outbox_messages(task: Any, count: int) -> list[Any]:
    """``count`` messages of ``task(i)``, built exactly as ``delay(i)`` builds them."""
    from celery_outbox.clock import utcnow
    from celery_outbox.dispatch.envelope import build_message

    now = utcnow()
    return [
        build_message(
            task,
            (i,),
            {},
            task_id=uuid(),
            options={},
            now=now,
            park_after=timedelta(seconds=30),
            max_bytes=None,
        )
        for i in range(count)
    ]


def seed_outbox(task: Any, count: int) -> list[str]:
    """Insert ``count`` pending rows of ``task(i)``; their task ids, in order."""
    from django_outbox.models import OutboxMessage
    from django_outbox.store.calls import clock_of
    from django_outbox.store.rows import new_message as new_row

    messages, now = outbox_messages(task, count), clock_of("default")()
    rows = [new_row(m, created_at=now) for m in messages]
    OutboxMessage.objects.bulk_create(rows, batch_size=2000)
    return [m.task_id for m in messages]
