"""Numbered task messages, built as ``task.delay(n)`` builds them, for tests that need rows.

:func:`numbered` is the message of ``task(n)`` with task id ``task-{n}``, built at
:data:`NOW` with no size limit; :func:`stored` is that message as the store wrote it,
with row id ``n``. Both take other field values after the build (``**changes``).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

from celery import Task

from celery_outbox.dispatch.envelope import build_message
from celery_outbox.store.records import NewMessage, StoredMessage

#: A fixed "now" to build messages at (tests give their stores and senders the same clock).
NOW = datetime(2030, 1, 1, tzinfo=timezone.utc)
#: A message whose ETA lies further ahead is parked in the table until then (none here).
PARK_AFTER = timedelta(seconds=30)


def numbered(
    task: Task[Any, Any],
    n: int,
    *,
    task_id: str | None = None,
    now: datetime = NOW,
    **changes: Any,
) -> NewMessage:
    """The message of ``task(n)``, id ``task_id`` (default ``task-{n}``), built at ``now``;
    then ``changes`` replace fields of the built message (``task_name``, ``payload``,
    ``locked_until``, ...). The id is built into the headers, so it is given as
    ``task_id``, never as a change.
    """
    message = build_message(
        task,
        (n,),
        {},
        task_id=f"task-{n}" if task_id is None else task_id,
        options={},
        now=now,
        park_after=PARK_AFTER,
        max_bytes=None,
    )
    return replace(message, **changes) if changes else message


def stored(task: Task[Any, Any], n: int, **changes: Any) -> StoredMessage:
    """``numbered(task, n)`` as the store wrote it, row id ``n``; then ``changes`` replace
    fields of the row (``payload``, ``status``, ``attempts``, ...; a ``task_id`` given here
    is not the one in the message's headers: see :func:`numbered`).
    """
    row = StoredMessage.written(numbered(task, n), n)
    return replace(row, **changes) if changes else row
