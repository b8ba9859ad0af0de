"""Requeue and discard dead letters from Django: the model, admin and command all come here.

Each function delegates to the core (:mod:`celery_outbox.dead_letters`), one letter per
transaction, so one letter that cannot be requeued (its task is not registered any more)
never stops the others. The model methods ``DeadLetter.requeue()`` / ``.discard()`` and
the queryset methods of the same names are thin wrappers over these functions.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from celery import Celery
from django.db import DEFAULT_DB_ALIAS, transaction

from celery_outbox import dead_letters as core
from celery_outbox.exceptions import DeadLetterDiscarded, OutboxError
from celery_outbox.records import DeadLetterStatus
from django_outbox.celery_app import outbox_app

if TYPE_CHECKING:
    from django_outbox.managers import DeadLetterQuerySet
    from django_outbox.models import DeadLetter


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


def requeue_letter(letter: DeadLetter, *, by: str = "", app: Celery | None = None) -> str:
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
    return _requeue_id(
        app or outbox_app(), letter.pk, by=by, using=letter._state.db or DEFAULT_DB_ALIAS
    )


def discard_letter(letter: DeadLetter, *, app: Celery | None = None) -> bool:
    """Mark one ``dead`` letter ``discarded``; ``False`` when it was not ``dead``."""
    return core.discard(app or outbox_app(), letter.pk, using=letter._state.db)


def requeue_letters(
    letters: DeadLetterQuerySet, *, by: str = "", app: Celery | None = None
) -> RequeueResult:
    """Requeue every ``dead`` letter of ``letters``, one transaction each, oldest first."""
    app = app or outbox_app()
    ids, selected = _dead_ids(letters)
    requeued: dict[int, str] = {}
    failed: dict[int, str] = {}
    discarded = 0
    for letter_id in ids:
        try:
            requeued[letter_id] = _requeue_id(app, letter_id, by=by, using=letters.db)
        except DeadLetterDiscarded:
            discarded += 1  # discarded since it was selected: skipped, not requeued
        except (LookupError, OutboxError) as exc:
            failed[letter_id] = str(exc)
    skipped = selected - len(ids) + discarded
    return RequeueResult(requeued=requeued, skipped=skipped, failed=failed)


def discard_letters(letters: DeadLetterQuerySet, *, app: Celery | None = None) -> int:
    """Discard every ``dead`` letter of ``letters``; return how many were discarded."""
    app = app or outbox_app()
    ids, _ = _dead_ids(letters)
    return sum(core.discard(app, letter_id, using=letters.db) for letter_id in ids)


def _requeue_id(app: Celery, letter_id: int, *, by: str, using: str) -> str:
    with transaction.atomic(using=using):
        return core.requeue(app, letter_id, by=by, using=using)


def _dead_ids(letters: DeadLetterQuerySet) -> tuple[list[int], int]:
    """The ids of the ``dead`` letters among ``letters`` (oldest failure first), and how
    many letters were selected in all."""
    rows: Iterable[tuple[int, str]] = letters.order_by("failed_at", "id").values_list(
        "id", "status"
    )
    pairs = list(rows)
    return [pk for pk, status in pairs if status == DeadLetterStatus.DEAD.value], len(pairs)
