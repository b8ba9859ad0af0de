"""Requeue and discard dead letters from Django: the one entry every Django surface uses.

The admin actions, ``manage.py outbox requeue`` and ``DeadLetter.requeue()`` /
``.discard()`` all call these functions, which delegate to the core
(:mod:`celery_outbox.dead_letters`) one letter per transaction, so one letter that
cannot be requeued (its task is not registered any more) never stops the others.

This module reads letters only through the querysets and instances it is given, so the
models can call it without an import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from celery import Celery
from django.db import transaction
from django.db.models import Model, QuerySet

from celery_outbox import dead_letters as core
from celery_outbox.exceptions import DeadLetterCompleted, DeadLetterDiscarded, OutboxError
from celery_outbox.store.records import DeadLetterStatus
from django_outbox._compat import instance_alias
from django_outbox.celery_app import outbox_app


@dataclass(frozen=True, kw_only=True)
class RequeueResult:
    """What a bulk requeue did.

    ``requeued`` maps each requeued letter's id to its new task id; ``skipped`` counts
    selected letters that were not ``dead`` (already requeued or discarded, including
    those discarded while this requeue ran); ``failed`` maps a letter id to why it could
    not be requeued.
    """

    requeued: dict[int, str] = field(default_factory=dict)
    skipped: int = 0
    failed: dict[int, str] = field(default_factory=dict)


def requeue_letters(
    letters: QuerySet[Any], *, by: str = "", app: Celery | None = None
) -> RequeueResult:
    """Requeue every ``dead`` letter of ``letters`` (a ``DeadLetter`` queryset), one
    transaction each, oldest failure first.
    """
    app = app or outbox_app()
    ids, selected = _dead_ids(letters)
    requeued: dict[int, str] = {}
    failed: dict[int, str] = {}
    discarded = 0
    for letter_id in ids:
        try:
            requeued[letter_id] = _requeue_id(app, letter_id, by=by, using=letters.db)
        except (DeadLetterDiscarded, DeadLetterCompleted):
            discarded += 1  # settled since it was selected: skipped, not requeued
        except (LookupError, OutboxError) as exc:
            failed[letter_id] = str(exc)
    skipped = selected - len(ids) + discarded
    return RequeueResult(requeued=requeued, skipped=skipped, failed=failed)


def requeue_letter(letter: Model, *, by: str = "", app: Celery | None = None) -> str:
    """Requeue one dead letter in its own transaction; return the (new or existing) task id.

    Raises
    ------
    LookupError
        The letter was deleted meanwhile.
    DeadLetterDiscarded
        The letter is discarded (perhaps while this ran): nothing was dispatched.
    OutboxError
        Its task is not registered with the app, or the store failed.
    """
    return _requeue_id(app or outbox_app(), letter.pk, by=by, using=instance_alias(letter))


def discard_letters(letters: QuerySet[Any], *, app: Celery | None = None) -> int:
    """Discard every ``dead`` letter of ``letters``; return how many were discarded."""
    app = app or outbox_app()
    ids, _ = _dead_ids(letters)
    return sum(core.discard(app, letter_id, using=letters.db) for letter_id in ids)


def discard_letter(letter: Model, *, app: Celery | None = None) -> bool:
    """Mark one ``dead`` letter ``discarded``; ``False`` when it was not ``dead``."""
    return core.discard(app or outbox_app(), letter.pk, using=instance_alias(letter))


def _requeue_id(app: Celery, letter_id: int, *, by: str, using: str) -> str:
    with transaction.atomic(using=using):
        return core.requeue(app, letter_id, by=by, using=using)


def _dead_ids(letters: QuerySet[Any]) -> tuple[list[int], int]:
    """The ids of the ``dead`` letters among ``letters`` (oldest failure first), and how
    many letters were selected in all.
    """
    pairs: list[tuple[int, str]] = list(
        letters.order_by("failed_at", "id").values_list("id", "status")
    )
    return [pk for pk, status in pairs if status == DeadLetterStatus.DEAD.value], len(pairs)
