"""The workflow tables: one ``Workflow`` row per canvas dispatched, one ``ChordJoin`` row per
chord whose header steps the database counts (:mod:`celery_outbox.workflows`).

Column names are those of the SQLAlchemy tables (``docs/schema.md``), so one database can
be served by either store. :mod:`django_outbox.models` imports both models.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from celery_outbox.records import (
    CHORD_JOIN_TABLE,
    TASK_ID_MAX_LENGTH,
    TASK_NAME_MAX_LENGTH,
    WORKFLOW_TABLE,
)

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
    group id (:mod:`celery_outbox.join_parts`). Internal: read and written by the store
    only."""

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
