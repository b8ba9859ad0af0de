"""Every model of the outbox app, in one module.

The workflow tables: one ``Workflow`` row per canvas dispatched, one ``ChordJoin`` row per
chord whose header steps the database counts (:mod:`celery_outbox.store.base`).

Column names are those of the SQLAlchemy tables (``docs/schema.md``), so one database can
be served by either store. :mod:`django_outbox.models` imports both models.

The sweep table: when the sweep of this database last recorded itself
(:mod:`celery_outbox.store.base`).

Column names are those of the SQLAlchemy table (``docs/schema.md``), so one database can
be served by either store. :mod:`django_outbox.models` imports the model.

The overview's entry in the admin: a proxy of the sweep table, without a table or rows of
its own, so the admin's "Celery outbox" section lists an "Overview" page
(:mod:`django_outbox.admin.overview`). :mod:`django_outbox.models` imports the model.

The outbox table, the dead letters, the delivery counts and the completed atomic tasks,
with their queries (the workflow tables: :mod:`django_outbox.models`).

Table, index and constraint names are those of ``docs/schema.md``, shared with the
SQLAlchemy store (``tests/contract/test_schema_parity.py`` compares both), so one
database can be served by either store.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from celery import Celery
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from celery_outbox.store.records import (
    CHORD_JOIN_TABLE,
    COMPLETED_TABLE,
    DEAD_LETTER_TABLE,
    DELIVERY_TABLE,
    OUTBOX_TABLE,
    SWEEP_TABLE,
    TASK_ID_MAX_LENGTH,
    TASK_NAME_MAX_LENGTH,
    WORKFLOW_TABLE,
    DeadLetterStatus,
    MessageStatus,
)
from django_outbox.dead_letters import (
    RequeueResult,
    discard_letter,
    discard_letters,
    requeue_letter,
    requeue_letters,
)

if TYPE_CHECKING:
    from typing_extensions import Self


# --- The workflow tables: one ``Workflow`` row per canvas dispatched, one ``ChordJoin`` row per

#: ``choices`` of ``Workflow.status``.
WORKFLOW_STATUS_CHOICES = [
    ("running", _("running")),
    ("succeeded", _("succeeded")),
    ("failed", _("failed")),
    ("cancelled", _("cancelled")),
]


class Workflow(models.Model):
    """A canvas of ``OutboxTask`` s (chain, group, chord), written in the transaction that
    dispatched it and counted step by step in each step's own transaction.

    ``root_id`` is the id Celery gives the canvas's tasks as ``root_id`` (a group or chord
    dispatched at the top: its group id). A step that
    becomes a dead letter marks it ``failed``; requeueing that letter makes it ``running``
    again (``failed_task_id`` keeps the last failure); cancelling a step makes it ``cancelled``.
    """

    id = models.BigAutoField(primary_key=True)
    root_id = models.CharField(_("root id"), max_length=TASK_ID_MAX_LENGTH, unique=True)
    name = models.CharField(_("name"), max_length=TASK_NAME_MAX_LENGTH)
    status = models.CharField(_("status"), max_length=16, choices=WORKFLOW_STATUS_CHOICES)
    steps_total = models.IntegerField(_("steps"))
    steps_done = models.IntegerField(_("steps done"))
    created_at = models.DateTimeField(_("created at"))
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)
    failed_task_id = models.CharField(
        _("failed task id"), max_length=TASK_ID_MAX_LENGTH, null=True, blank=True
    )

    class Meta:
        db_table = WORKFLOW_TABLE
        # The workflows gauge counts each status at every scrape (celery_outbox.metrics).
        # The admin's workflow list is ordered by creation, newest first.
        indexes = [
            models.Index(fields=["status"], name="outbox_workflow_status_idx"),
            models.Index(fields=["created_at", "id"], name="outbox_workflow_created_idx"),
        ]
        verbose_name = _("workflow")
        verbose_name_plural = _("workflows")

    def __str__(self) -> str:
        return f"{self.name}[{self.root_id}] ({self.status})"


class ChordJoin(models.Model):
    """The header steps of one chord still to come (``remaining``) and the results of
    those in (``results``: JSON text, one entry per header step), keyed by the chord's
    group id (:mod:`celery_outbox.store.records`). Internal: read and written by the store
    only.
    """

    id = models.BigAutoField(primary_key=True)
    group_id = models.CharField(_("group id"), max_length=TASK_ID_MAX_LENGTH, unique=True)
    root_id = models.CharField(_("root id"), max_length=TASK_ID_MAX_LENGTH)
    size = models.IntegerField(_("size"))
    remaining = models.IntegerField(_("remaining"))
    results = models.TextField(_("results"))
    created_at = models.DateTimeField(_("created at"))

    class Meta:
        db_table = CHORD_JOIN_TABLE
        verbose_name = _("chord join")
        verbose_name_plural = _("chord joins")

    def __str__(self) -> str:
        return f"chord {self.group_id}: {self.remaining} of {self.size} to go"


# --- The sweep table: when the sweep of this database last recorded itself


class SweepRecord(models.Model):
    """One row per kind of sweep (``sweep``): its last run, by the database's clock.

    Written at most once per ``outbox_sweep_interval`` whatever the number of sweepers;
    read by ``manage.py outbox health`` and ``outbox status``. Internal: written by the
    store only.
    """

    name = models.CharField(_("name"), max_length=64, primary_key=True)
    last_sweep_at = models.DateTimeField(_("last sweep at"))

    class Meta:
        db_table = SWEEP_TABLE
        verbose_name = _("sweep record")
        verbose_name_plural = _("sweep records")

    def __str__(self) -> str:
        return f"{self.name} last ran {self.last_sweep_at:%Y-%m-%d %H:%M:%S}"


# --- The overview's entry in the admin: a proxy of the sweep table, without a table or rows of


class Overview(SweepRecord):
    """The admin's overview page (no permissions of its own: it is open to users who may
    view dead letters or outbox messages).
    """

    class Meta:
        proxy = True
        default_permissions = ()
        verbose_name = _("overview")
        verbose_name_plural = _("overview")


# --- The outbox table, the dead letters, the delivery counts and the completed atomic tasks,

#: ``choices`` of ``OutboxMessage.status``.
MESSAGE_STATUS_CHOICES = [
    (MessageStatus.PENDING.value, _("pending")),
    (MessageStatus.PUBLISHED.value, _("published")),
    (MessageStatus.FAILED.value, _("failed")),
]

#: ``choices`` of ``DeadLetter.status``.
DEAD_LETTER_STATUS_CHOICES = [
    (DeadLetterStatus.DEAD.value, _("dead")),
    (DeadLetterStatus.REQUEUED.value, _("requeued")),
    (DeadLetterStatus.DISCARDED.value, _("discarded")),
    (DeadLetterStatus.COMPLETED.value, _("completed")),
]


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
        # The due index's order (ties: the index's): ordering by (available_at, id) made
        # PostgreSQL sort every row due at the same instant to claim the first few.
        return rows.order_by("available_at")

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

    def requeue(self, *, by: str = "", app: Celery | None = None) -> RequeueResult:
        """Requeue every ``dead`` letter here, one transaction each, oldest failure first
        (:func:`django_outbox.dead_letters.requeue_letters`: the one requeue path).
        """
        return requeue_letters(self, by=by, app=app)

    def discard(self, *, app: Celery | None = None) -> int:
        """Discard every ``dead`` letter here; how many were
        (:func:`django_outbox.dead_letters.discard_letters`).
        """
        return discard_letters(self, app=app)


#: Managers of the two models.
OutboxMessageManager = models.Manager.from_queryset(OutboxMessageQuerySet)

DeadLetterManager = models.Manager.from_queryset(DeadLetterQuerySet)


class SharedNameIndex(models.Index):
    """An index whose name comes from the shared schema and may exceed Django's 30 characters.

    Django caps index names at 30 characters for Oracle before 12.2; every database this
    library supports allows 63 or more, and the SQLAlchemy store uses the same names.
    """

    max_name_length = 63


class OutboxMessage(models.Model):
    """A task message written in the dispatching transaction, waiting to be published.

    ``id`` is the row's own key, not the task id: a parked retry is a new row with the
    same ``task_id``. At most one ``pending`` row per ``task_id`` (a partial unique index
    where the database has them; on MySQL/MariaDB a unique index over the generated column
    ``pending_task_id`` that migration 0008 adds, not a field of the model).
    """

    id = models.BigAutoField(primary_key=True)
    task_id = models.CharField(_("task id"), max_length=TASK_ID_MAX_LENGTH)
    task_name = models.CharField(_("task name"), max_length=TASK_NAME_MAX_LENGTH)
    payload = models.TextField(_("payload"))
    options = models.JSONField(_("options"))
    status = models.CharField(
        _("status"),
        max_length=16,
        choices=MESSAGE_STATUS_CHOICES,
        default=MessageStatus.PENDING.value,
    )
    available_at = models.DateTimeField(_("available at"))
    attempts = models.IntegerField(_("publish attempts"), default=0)
    last_error = models.TextField(_("last error"), default="", blank=True)
    locked_until = models.DateTimeField(_("locked until"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"), default=timezone.now)
    published_at = models.DateTimeField(_("published at"), null=True, blank=True)

    objects = OutboxMessageManager()

    class Meta:
        db_table = OUTBOX_TABLE
        verbose_name = _("outbox message")
        verbose_name_plural = _("outbox messages")
        indexes = [
            models.Index(fields=["status", "available_at"], name="celery_outbox_due_idx"),
            models.Index(fields=["task_id"], name="celery_outbox_task_id_idx"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["task_id"],
                condition=models.Q(status=MessageStatus.PENDING.value),
                name="celery_outbox_pending_task_uniq",
            ),
        ]
        permissions = [("cancel_outboxmessage", _("Can cancel pending outbox messages"))]

    def __str__(self) -> str:
        return f"{self.task_name}[{self.task_id}] ({self.status})"


class DeadLetter(models.Model):
    """A task that ended without a retry: inspect it, then requeue or discard it."""

    id = models.BigAutoField(primary_key=True)
    task_id = models.CharField(_("task id"), max_length=TASK_ID_MAX_LENGTH)
    task_name = models.CharField(_("task name"), max_length=TASK_NAME_MAX_LENGTH)
    args = models.JSONField(_("args"))
    kwargs = models.JSONField(_("kwargs"))
    options = models.JSONField(_("options"))
    exception_type = models.CharField(_("exception type"), max_length=255)
    exception_message = models.TextField(_("exception message"))
    traceback = models.TextField(_("traceback"))
    retries = models.IntegerField(_("retries"))
    first_failed_at = models.DateTimeField(_("first failed at"))
    failed_at = models.DateTimeField(_("failed at"))
    status = models.CharField(
        _("status"),
        max_length=16,
        choices=DEAD_LETTER_STATUS_CHOICES,
        default=DeadLetterStatus.DEAD.value,
    )
    requeued_at = models.DateTimeField(_("requeued at"), null=True, blank=True)
    requeued_by = models.CharField(_("requeued by"), max_length=150, default="", blank=True)
    requeued_task_id = models.CharField(
        _("requeued task id"), max_length=TASK_ID_MAX_LENGTH, default="", blank=True
    )

    objects = DeadLetterManager()

    class Meta:
        db_table = DEAD_LETTER_TABLE
        verbose_name = _("dead letter")
        verbose_name_plural = _("dead letters")
        indexes = [
            models.Index(fields=["task_id"], name="celery_outbox_dl_task_id_idx"),
            SharedNameIndex(
                fields=["status", "failed_at"], name="celery_outbox_dl_status_failed_idx"
            ),
        ]
        permissions = [
            ("requeue_deadletter", _("Can requeue dead letters")),
            ("discard_deadletter", _("Can discard dead letters")),
        ]

    def __str__(self) -> str:
        return f"{self.task_name}[{self.task_id}] {self.exception_type} ({self.status})"

    def requeue(self, *, by: str = "", app: Celery | None = None) -> str:
        """Dispatch this letter's task again as a new task id (fresh retry budget).

        The outbox row is written in the caller's transaction; requeuing a letter already
        requeued does nothing and returns its existing ``requeued_task_id``.

        Raises
        ------
        DeadLetterDiscarded
            The letter is discarded (perhaps while this ran): nothing was dispatched.
        """
        return requeue_letter(self, by=by, app=app)

    def discard(self, *, app: Celery | None = None) -> bool:
        """Mark this letter ``discarded``; ``False`` when it was not ``dead``."""
        return discard_letter(self, app=app)


class DeliveryCount(models.Model):
    """How many times a task message was delivered without finishing.

    Only redelivered messages get a row (a first delivery writes nothing); the row is
    dropped when the attempt finishes. Past ``outbox_max_deliveries`` the task is
    dead-lettered without running.
    """

    task_id = models.CharField(_("task id"), max_length=TASK_ID_MAX_LENGTH, primary_key=True)
    deliveries = models.IntegerField(_("deliveries"))
    updated_at = models.DateTimeField(_("updated at"))

    class Meta:
        db_table = DELIVERY_TABLE
        verbose_name = _("delivery count")
        verbose_name_plural = _("delivery counts")

    def __str__(self) -> str:
        return f"{self.task_id}: {self.deliveries} deliveries"


class CompletedTask(models.Model):
    """An atomic task that committed, written in the task's own transaction.

    A delivery whose ``task_id`` has a row is a duplicate and does not run. ``result`` is
    the return value in the task's serializer (``None`` when it returned ``None``). Rows
    older than ``outbox_keep_completed`` are purged by the sweep.
    """

    id = models.BigAutoField(primary_key=True)
    task_id = models.CharField(_("task id"), max_length=TASK_ID_MAX_LENGTH, unique=True)
    task_name = models.CharField(_("task name"), max_length=TASK_NAME_MAX_LENGTH)
    completed_at = models.DateTimeField(_("completed at"))
    result = models.TextField(_("result"), null=True, blank=True)
    root_id = models.CharField(_("workflow"), max_length=TASK_ID_MAX_LENGTH, null=True, blank=True)

    class Meta:
        db_table = COMPLETED_TABLE
        verbose_name = _("completed task")
        verbose_name_plural = _("completed tasks")
        indexes = [
            models.Index(fields=["completed_at"], name="celery_outbox_completed_at_idx"),
            SharedNameIndex(fields=["task_name"], name="celery_outbox_completed_name_idx"),
            SharedNameIndex(fields=["root_id"], name="celery_outbox_completed_root_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.task_name}[{self.task_id}] completed {self.completed_at:%Y-%m-%d %H:%M:%S}"
