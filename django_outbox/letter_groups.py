"""Requeue or discard a group of dead letters: the ``dead`` letters of one task and one
exception type, from the admin's overview page.

A group action acts on the letters the confirmation page counted: those with an id up to
the newest one seen then (``upto``; letters that failed since are left for the next
look), and at most :data:`GROUP_BATCH` of them, the oldest failure first, so one request
stays short (``manage.py outbox requeue --task T --exception E`` does any number). Each
letter is requeued or discarded in its own transaction through
:mod:`django_outbox.dead_letters`, as the list's actions do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import QuerySet

from celery_outbox.records import DeadLetterStatus
from django_outbox.dead_letters import RequeueResult, discard_letters, requeue_letters
from django_outbox.models import DeadLetter

#: Letters one group action acts on at most.
GROUP_BATCH = 1000
#: A group's letters counted at most on the confirmation page.
COUNT_CAP = 10_000


@dataclass(frozen=True, kw_only=True)
class LetterGroupKey:
    """Which letters a group action acts on: ``dead`` letters of ``task_name`` failed with
    ``exception_type`` whose id is at most ``upto``."""

    task_name: str
    exception_type: str
    upto: int

    @classmethod
    def parse(cls, data: Any) -> LetterGroupKey:
        """The key from a request's ``task``, ``exception`` and ``upto`` parameters.

        Raises
        ------
        ValueError
            A parameter is missing, or ``upto`` is not a whole number.
        """
        task, exception, upto = (data.get(name, "") for name in ("task", "exception", "upto"))
        if not task or not exception:
            raise ValueError(
                f"task={task!r}, exception={exception!r}: both are required (a task name "
                "and an exception type, as the overview's groups give them)."
            )
        try:
            limit = int(upto)
        except (TypeError, ValueError):
            raise ValueError(f"upto={upto!r} is not accepted: give a whole number.") from None
        return cls(task_name=task, exception_type=exception, upto=limit)


def group_letters(key: LetterGroupKey, *, using: str) -> QuerySet[Any]:
    """Every ``dead`` letter ``key`` names."""
    letters: QuerySet[Any] = DeadLetter.objects.using(using).filter(
        status=DeadLetterStatus.DEAD.value,
        task_name=key.task_name,
        exception_type=key.exception_type,
        id__lte=key.upto,
    )
    return letters


def count_group(key: LetterGroupKey, *, using: str) -> tuple[int, bool]:
    """How many letters ``key`` names, up to :data:`COUNT_CAP`; and whether there are more."""
    found = group_letters(key, using=using).order_by()[: COUNT_CAP + 1].count()
    return min(found, COUNT_CAP), found > COUNT_CAP


def batch(key: LetterGroupKey, *, using: str) -> QuerySet[Any]:
    """The oldest :data:`GROUP_BATCH` letters ``key`` names (one action's share)."""
    ids = list(
        group_letters(key, using=using)
        .order_by("failed_at", "id")
        .values_list("id", flat=True)[:GROUP_BATCH]
    )
    chosen: QuerySet[Any] = DeadLetter.objects.using(using).filter(id__in=ids)
    return chosen


def requeue_group(key: LetterGroupKey, *, by: str, using: str) -> RequeueResult:
    """Requeue one batch of the group (see the module)."""
    return requeue_letters(batch(key, using=using), by=by)


def discard_group(key: LetterGroupKey, *, using: str) -> tuple[int, int]:
    """Discard one batch of the group; ``(selected, discarded)``."""
    letters = batch(key, using=using)
    selected = letters.count()
    return selected, discard_letters(letters)
