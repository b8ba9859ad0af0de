"""The Celery app the admin and ``outbox requeue`` tests requeue through, and row factories.

Tests point ``DJANGO_OUTBOX_CELERY_APP`` at ``tests.django.admin_app:app``. It runs on the
in-memory broker; a test needing a real broker and worker replaces ``app`` (the setting
is resolved on every use) with one built by :func:`tests.django.celery_app.create_app`.
"""

from __future__ import annotations

import os
import uuid
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from celery import Celery

from celery_outbox import OutboxTask
from celery_outbox.clock import utcnow
from celery_outbox.store.records import MessageStatus
from tests.django.celery_app import RECORD, create_app

if TYPE_CHECKING:
    from django_outbox.models import OutboxMessage

#: Value of ``DJANGO_OUTBOX_CELERY_APP`` in these tests.
APP_PATH = "tests.django.admin_app:app"

#: A second task name, registered here only.
OTHER = "outbox_admin.other"

#: The app (replaceable: see the module docstring).
app: Celery = create_app(
    os.environ.get("OUTBOX_TEST_ADMIN_BROKER", "memory://"), "outbox-admin-tests"
)


@app.task(base=OutboxTask, name=OTHER)
def other(*args: Any, **kwargs: Any) -> None:
    """Does nothing: a second task for filters."""


#: A fixed "now" for dead letters, so time filters are deterministic.
BASE_TIME = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)


def make_letter(**fields: Any) -> Any:
    """Save and return a ``dead`` letter of the ``record`` task; ``fields`` override."""
    from django_outbox.models import DeadLetter

    values: dict[str, Any] = {
        "task_id": str(uuid.uuid4()),
        "task_name": RECORD,
        "args": [None],
        "kwargs": {},
        "options": {"queue": "outbox-admin-tests"},
        "exception_type": "builtins.ValueError",
        "exception_message": "boom",
        "traceback": "Traceback (most recent call last):\nValueError: boom\n",
        "retries": 5,
        "first_failed_at": BASE_TIME - timedelta(minutes=5),
        "failed_at": BASE_TIME,
    }
    values.update(fields)
    using = values.pop("using", "default")
    letter = DeadLetter(**values)
    letter.save(using=using)
    return letter


def pending_row(**fields: Any) -> OutboxMessage:
    """Save and return a ``pending`` outbox row of the ``record`` task, due now (JSON
    payload, no retries yet); ``fields`` override.
    """
    from django_outbox.models import OutboxMessage

    values: dict[str, Any] = {
        "task_id": str(uuid.uuid4()),
        "task_name": RECORD,
        "payload": '[[], {"order": 7}, {}]',
        "options": {"content_type": "application/json", "headers": {"retries": 0}},
        "status": MessageStatus.PENDING.value,
        "available_at": utcnow(),
    }
    values.update(fields)
    row: OutboxMessage = OutboxMessage.objects.create(**values)
    return row


def dispatch_row(**options: Any) -> Any:
    """Dispatch ``record`` through the outbox inside the current transaction; its row."""
    from django_outbox.models import OutboxMessage

    result = app.tasks[RECORD].apply_async(kwargs={"user_id": None}, **options)
    return OutboxMessage.objects.get(task_id=result.id)
