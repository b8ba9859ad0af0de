"""Celery-style signals the core sends (the Django app re-sends them as Django signals)."""

from __future__ import annotations

from typing import Any

from celery.utils.dispatch import Signal

#: Sent after outbox rows reached the broker: ``sender`` is the app, ``task_ids`` a list,
#: ``messages`` the published rows (:class:`~celery_outbox.store.records.StoredMessage`, in the
#: order of ``task_ids``) and ``path`` the entry point that published them
#: (:data:`~celery_outbox.relay.relay.PublishPath`: ``commit``, ``sweep``, ``relay`` or ``now``).
message_published = Signal(
    name="outbox_message_published", providing_args=["task_ids", "messages", "path"]
)
#: Sent after a publish pass left rows unpublished (rescheduled, or failed for good):
#: ``sender`` is the app, ``task_ids`` a list, ``path`` as for ``message_published``,
#: ``gave_up`` how many of them are now ``failed``.
message_publish_failed = Signal(
    name="outbox_message_publish_failed", providing_args=["task_ids", "path", "gave_up"]
)
#: Sent after a task became a dead letter: ``sender`` is the task, ``letter_id`` and
#: ``exception`` are given.
task_dead_lettered = Signal(
    name="outbox_task_dead_lettered", providing_args=["letter_id", "task_id", "exception"]
)
#: Sent after a dead letter was requeued: ``letter_id``, ``task_id`` (the new one), ``by``.
dead_letter_requeued = Signal(
    name="outbox_dead_letter_requeued", providing_args=["letter_id", "task_id", "by"]
)
#: Sent when a worker scheduled a task's retry without sleeping: ``sender`` is the task,
#: ``task_id``, ``eta`` (when it runs) and ``path``: ``eta`` (published at once with a
#: Celery ETA) or ``parked`` (kept as an outbox row until due).
task_retry_scheduled = Signal(
    name="outbox_task_retry_scheduled", providing_args=["task_id", "eta", "path"]
)
#: Sent when an atomic task's duplicate delivery was skipped without running: ``sender`` is
#: the task, ``task_id`` and ``completed_at`` (when the first run committed) are given.
task_duplicate_skipped = Signal(
    name="outbox_task_duplicate_skipped", providing_args=["task_id", "completed_at"]
)
#: Sent when an ``OutboxTask`` was dispatched (``delay``/``apply_async``), in the caller's
#: transaction: ``sender`` is the task; ``task_id``, ``args``, ``kwargs``, ``options`` (the
#: ``apply_async`` options given), ``using`` (the alias given), ``message`` (the row's
#: ``NewMessage``; ``None`` under ``task_always_eager``, which writes no row) and ``row_id``
#: (``None`` when no row was written: eager, or the task id was already pending).
#: The pytest plugin records dispatches with it (:mod:`celery_outbox.testing.recorder`).
task_dispatched = Signal(
    name="outbox_task_dispatched",
    providing_args=["task_id", "args", "kwargs", "options", "using", "message", "row_id"],
)


def announce_dispatch(
    task: Any, task_id: str, args: Any, kwargs: Any, options: Any, **row: Any
) -> None:
    """Send :data:`task_dispatched` (``row``: ``using``, ``message``, ``row_id``); free
    while nobody listens.
    """
    if task_dispatched.receivers:
        given = {k: v for k, v in options.items() if v is not None}
        kwargs = dict(kwargs or {})
        task_dispatched.send(
            task, task_id=task_id, args=tuple(args or ()), kwargs=kwargs, options=given, **row
        )
