"""Dead letters and delivery counts through the ORM (the same on every database)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from django.db import IntegrityError, transaction
from django.db.models import F

from celery_outbox.store.records import (
    NewDeadLetter,
    NewMessage,
    StoredDeadLetter,
)
from celery_outbox.store.transitions import COMPLETE, DISCARD, REQUEUE
from django_outbox.models import DeadLetter, DeliveryCount
from django_outbox.store import rows as convert
from django_outbox.store import workflows
from django_outbox.store.vendors import locking

#: Inserts an outbox row (the alias's strategy): its id, or ``None`` when already pending.
Insert = Callable[[NewMessage], "int | None"]


def record_delivery(task_id: str, *, now: datetime, alias: str) -> int:
    """Add one to the task's delivery count (2 on its first redelivery); committed."""
    counts = DeliveryCount.objects.using(alias)
    with transaction.atomic(using=alias):
        if not counts.filter(task_id=task_id).update(
            deliveries=F("deliveries") + 1, updated_at=now
        ):
            try:
                with transaction.atomic(using=alias):
                    counts.create(task_id=task_id, deliveries=2, updated_at=now)
            except IntegrityError:  # another worker counted it first
                counts.filter(task_id=task_id).update(
                    deliveries=F("deliveries") + 1, updated_at=now
                )
        return int(counts.get(task_id=task_id).deliveries)


def forget_deliveries(task_id: str, *, alias: str) -> None:
    """Drop the task's delivery count (a no-op without one)."""
    DeliveryCount.objects.using(alias).filter(task_id=task_id).delete()


def add_dead_letter(letter: NewDeadLetter, *, alias: str, workflow: str | None = None) -> int:
    """Write a dead letter in the caller's transaction (at once outside one); with
    ``workflow``, mark that workflow failed by the letter's task in the same transaction.
    """
    row = convert.new_dead_letter(letter)
    with transaction.atomic(using=alias, savepoint=False):
        row.save(using=alias, force_insert=True)
        if workflow is not None:
            workflows.mark_failed(workflow, letter.task_id, now=letter.failed_at, alias=alias)
    return int(row.pk)


def get_dead_letter(letter_id: int, *, alias: str) -> StoredDeadLetter | None:
    """The dead letter with that id, or ``None``."""
    row = DeadLetter.objects.using(alias).filter(pk=letter_id).first()
    return None if row is None else convert.stored_dead_letter(row)


def requeue_dead_letter(
    letter_id: int,
    message: NewMessage,
    insert: Insert,
    *,
    by: str,
    now: datetime,
    alias: str,
    workflow: str | None = None,
) -> tuple[str, int | None]:
    """Add ``message`` with ``insert``, mark the letter ``requeued`` and resume its
    ``workflow`` (when given), in one transaction.
    """
    with transaction.atomic(using=alias):
        letter = locking(
            DeadLetter.objects.using(alias).filter(pk=letter_id), skip_locked=False
        ).first()
        if letter is None:
            raise LookupError(f"No dead letter with id {letter_id!r} in {alias!r}.")
        if not REQUEUE.allows(letter.status):
            return letter.requeued_task_id, None
        row_id = insert(message)
        DeadLetter.objects.using(alias).filter(pk=letter_id).update(
            status=REQUEUE.target,
            requeued_at=now,
            requeued_by=by,
            requeued_task_id=message.task_id,
        )
        if workflow is not None:
            workflows.resume(workflow, alias=alias)
    return message.task_id, row_id


def complete_dead_letters(task_id: str, *, alias: str) -> int:
    """Mark the ``dead`` letters of ``task_id`` ``completed``: one ``UPDATE``."""
    letters = DeadLetter.objects.using(alias).filter(task_id=task_id)
    return int(letters.filter(status__in=COMPLETE.sources).update(status=COMPLETE.target))


def discard_dead_letter(letter_id: int, *, alias: str) -> bool:
    """Mark a ``dead`` letter ``discarded``: one ``UPDATE``."""
    changed = (
        DeadLetter.objects.using(alias)
        .filter(pk=letter_id, status__in=DISCARD.sources)
        .update(status=DISCARD.target)
    )
    return bool(changed)
