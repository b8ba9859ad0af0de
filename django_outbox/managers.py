"""Querysets of the outbox models: every query the store and the admin run lives here."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, TypeVar

from django.db import connections, models

from celery_outbox.records import DeadLetterStatus, MessageStatus

if TYPE_CHECKING:
    from celery import Celery
    from typing_extensions import Self

    from django_outbox.dead_letters import RequeueResult

    # Named as strings in the QuerySet bases below (a runtime subscript ruff does not read).
    from django_outbox.models import DeadLetter, OutboxMessage  # noqa: F401

_M = TypeVar("_M", bound=models.Model)


class OutboxMessageQuerySet(models.QuerySet["OutboxMessage"]):
    """Queries over outbox rows."""

    def pending(self) -> Self:
        """Rows waiting to be published."""
        return self.filter(status=MessageStatus.PENDING.value)

    def unleased(self, now: datetime) -> Self:
        """Rows no publisher holds a lease on at ``now``."""
        return self.filter(models.Q(locked_until__isnull=True) | models.Q(locked_until__lte=now))

    def due(self, now: datetime, created_before: datetime | None = None) -> Self:
        """Pending, unleased rows due at ``now``, oldest due first.

        With ``created_before``, only rows created before it, or parked (due after they
        were created): younger rows may still belong to their on-commit publisher.
        """
        rows = self.pending().unleased(now).filter(available_at__lte=now)
        if created_before is not None:
            rows = rows.filter(
                models.Q(created_at__lte=created_before)
                | models.Q(available_at__gt=models.F("created_at"))
            )
        return rows.order_by("available_at", "id")

    def leased_by(self, ids: Sequence[int], leases: Collection[datetime]) -> Self:
        """Those of ``ids`` still leased until one of ``leases`` (a claim's fencing tokens)."""
        return self.filter(id__in=list(ids), locked_until__in=list(leases))

    def with_ids(self, ids: Iterable[int]) -> Self:
        """Rows whose primary key is in ``ids``."""
        return self.filter(id__in=list(ids))

    def resettable(self) -> Self:
        """Rows that ``reset`` may make pending again (not published ones)."""
        return self.filter(status__in=[MessageStatus.PENDING.value, MessageStatus.FAILED.value])

    def task_ids_pending(self, task_ids: Iterable[str]) -> set[str]:
        """Which of ``task_ids`` already have a pending row."""
        return set(
            self.pending().filter(task_id__in=list(task_ids)).values_list("task_id", flat=True)
        )

    def counts_by_status(self) -> dict[str, int]:
        """Number of rows per status value (statuses without rows are absent)."""
        rows = self.order_by().values_list("status").annotate(n=models.Count("id"))
        return {status: count for status, count in rows}

    def oldest_pending_created_at(self) -> datetime | None:
        """``created_at`` of the oldest pending row."""
        oldest: datetime | None = self.pending().aggregate(oldest=models.Min("created_at"))[
            "oldest"
        ]
        return oldest

    def purgeable(self, statuses: Iterable[str], older_than: datetime) -> Self:
        """Rows in ``statuses`` created before ``older_than``, oldest first."""
        return self.filter(status__in=list(statuses), created_at__lt=older_than).order_by("id")


class DeadLetterQuerySet(models.QuerySet["DeadLetter"]):
    """Queries over dead letters."""

    def dead(self) -> Self:
        """Letters neither requeued nor discarded."""
        return self.filter(status=DeadLetterStatus.DEAD.value)

    def for_task(self, task_name: str) -> Self:
        """Letters of one task name."""
        return self.filter(task_name=task_name)

    def requeue(self, *, by: str = "", app: Celery | None = None) -> RequeueResult:
        """Requeue every ``dead`` letter here, one transaction each (see
        :func:`django_outbox.dead_letters.requeue_letters`)."""
        from django_outbox.dead_letters import requeue_letters

        return requeue_letters(self, by=by, app=app)

    def discard(self, *, app: Celery | None = None) -> int:
        """Discard every ``dead`` letter here; return how many."""
        from django_outbox.dead_letters import discard_letters

        return discard_letters(self, app=app)


def locking(rows: models.QuerySet[_M], *, skip_locked: bool) -> models.QuerySet[_M]:
    """``rows`` with ``SELECT ... FOR UPDATE``, skipping locked rows where the database can.

    Databases without ``FOR UPDATE`` (SQLite) ignore it: their write lock serialises
    writers instead.
    """
    can_skip = connections[rows.db].features.has_select_for_update_skip_locked
    return rows.select_for_update(skip_locked=skip_locked and can_skip)


#: Managers of the two models.
OutboxMessageManager = models.Manager.from_queryset(OutboxMessageQuerySet)
DeadLetterManager = models.Manager.from_queryset(DeadLetterQuerySet)
