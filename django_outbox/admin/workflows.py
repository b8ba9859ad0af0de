"""The admin of workflows: a read-only list of ``Workflow`` rows, and a page per workflow
listing its steps.

A workflow's steps are found three ways, each bounded to :data:`STEPS_SHOWN` rows:
done steps are the ``CompletedTask`` rows of its ``root_id`` (an indexed column); failed
steps are the dead letters with a canvas whose options hold it (``options["canvas"]
["root_id"]``; the root step's own letter may have a canvas without it, found by its task
id); pending steps are the ``pending`` outbox rows whose Celery headers hold it
(``options["headers"]["root_id"]``). Both JSON lookups are spelled as the partial
expression indexes of :mod:`celery_outbox.store.schema` index them on PostgreSQL (the key
as ``jsonb``, ``#>``, under the index's condition); other databases scan. Every value is
escaped (``format_html``). Chord joins are internal and have no admin.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

from django.contrib import admin
from django.db.models import Model, Q, QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.functional import Promise
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext_lazy as _

from django_outbox._compat import instance_alias
from django_outbox.admin.base import ReadOnlyAdmin, clipped, id_cell, short_time
from django_outbox.admin.paging import recent_values_filter
from django_outbox.models import CompletedTask, DeadLetter, OutboxMessage, Workflow

#: Rows of each kind of step a workflow page shows.
STEPS_SHOWN = 100

_M = TypeVar("_M", bound=Model)


def admin_link(row: Model, text: str) -> SafeString:
    """A link to ``row``'s admin page, ``text`` escaped."""
    meta = row._meta
    url = reverse(f"admin:{meta.app_label}_{meta.model_name}_change", args=[row.pk])
    return format_html('<a href="{}">{}</a>', url, text)


def _when(value: datetime) -> str:
    """``value`` in the current time zone, formatted as the admin shows datetimes."""
    return date_format(timezone.localtime(value), "DATETIME_FORMAT")


def breakable(name: str) -> SafeString:
    """``name``, escaped, with a line-break opportunity after each ``.`` and ``_``."""
    parts = re.split(r"(?<=[._])", name)
    return format_html_join(mark_safe("<wbr>"), "{}", ((part,) for part in parts))


def _row(cells: Sequence[Any]) -> SafeString:
    return format_html("<tr>{}</tr>", format_html_join("", "<td>{}</td>", ((c,) for c in cells)))


def steps_table(
    rows: QuerySet[_M], headers: Sequence[str | Promise], cells: Callable[[_M], Sequence[Any]]
) -> SafeString | str:
    """An escaped table of the first :data:`STEPS_SHOWN` of ``rows``; ``-`` without any."""
    found = list(rows[: STEPS_SHOWN + 1])
    if not found:
        return "-"
    head = format_html_join("", "<th>{}</th>", ((h,) for h in headers))
    body = format_html_join("", "{}", ((_row(cells(r)),) for r in found[:STEPS_SHOWN]))
    cut = len(found) > STEPS_SHOWN
    note = format_html("<p>{}</p>", _("Only the first %d are shown.") % STEPS_SHOWN) if cut else ""
    return format_html(
        '<table class="outbox-steps"><thead><tr>{}</tr></thead><tbody>{}</tbody></table>{}',
        head,
        body,
        note,
    )


def letter_workflow(letter: DeadLetter) -> SafeString | str:
    """A link to the workflow a dead letter's task is a step of; its root id unlinked when
    the workflow row is gone, ``-`` outside one.
    """
    canvas = (letter.options or {}).get("canvas")
    if not isinstance(canvas, dict):
        return "-"
    root_id = str(canvas.get("root_id") or letter.task_id)  # the root step's own id
    row = Workflow.objects.using(instance_alias(letter)).filter(root_id=root_id).first()
    return root_id if row is None else admin_link(row, root_id)


@admin.register(Workflow)
class WorkflowAdmin(ReadOnlyAdmin):
    """Workflows (Celery canvases on the outbox): their progress, and each one's steps."""

    # Compact columns: the list stays readable at 1280 px beside the navigation and filters.
    list_display = ("root", "short_name", "status", "progress", "created", "finished")
    list_filter = ("status", recent_values_filter("name", "name"), "created_at")
    search_fields = ("root_id",)
    search_help_text = _("An exact root id.")
    ordering = ("-created_at", "-id")
    readonly_fields = (
        "root_id",
        "name",
        "status",
        "progress",
        "created_at",
        "finished_at",
        "failed_task",
        "done_steps",
        "dead_steps",
        "pending_steps",
    )
    fieldsets = (
        (None, {"fields": readonly_fields[:7]}),
        (_("Steps"), {"fields": readonly_fields[7:]}),
    )

    @admin.display(description=_("steps done"))
    def progress(self, workflow: Workflow) -> SafeString:
        """``done / total``, on one line."""
        return format_html(
            '<span class="outbox-nowrap">{} / {}</span>',
            workflow.steps_done,
            workflow.steps_total,
        )

    @admin.display(description=_("root id"), ordering="root_id")
    def root(self, workflow: Workflow) -> SafeString:
        """The root id in three lines at most (a uuid fills them), whole on hover."""
        return id_cell(workflow.root_id)

    @admin.display(description=_("name"), ordering="name")
    def short_name(self, workflow: Workflow) -> SafeString:
        """The name in two lines at most; in full on hover."""
        return clipped(workflow.name)

    @admin.display(description=_("created at"), ordering="created_at")
    def created(self, workflow: Workflow) -> SafeString | str:
        """``created_at``, short."""
        return short_time(workflow.created_at)

    @admin.display(description=_("finished at"), ordering="finished_at")
    def finished(self, workflow: Workflow) -> SafeString | str:
        """``finished_at``, short; ``-`` while running."""
        return short_time(workflow.finished_at)

    @admin.display(description=_("failed task id"))
    def failed_task(self, workflow: Workflow) -> SafeString | str:
        """The last step that failed, linked to its latest dead letter when there is one."""
        task_id = workflow.failed_task_id
        if not task_id:
            return "-"
        letters = DeadLetter.objects.using(instance_alias(workflow)).filter(task_id=task_id)
        letter = letters.only("id").order_by("-failed_at", "-id").first()
        return task_id if letter is None else admin_link(letter, task_id)

    @admin.display(description=_("done"))
    def done_steps(self, workflow: Workflow) -> SafeString | str:
        """The workflow's completed atomic steps, oldest first, linked."""
        alias = instance_alias(workflow)
        rows = CompletedTask.objects.using(alias).filter(root_id=workflow.root_id)
        return steps_table(
            rows.order_by("completed_at", "id").defer("result"),
            [_("task name"), _("task id"), _("completed at")],
            lambda r: (r.task_name, admin_link(r, r.task_id), _when(r.completed_at)),
        )

    @admin.display(description=_("dead letters"))
    def dead_steps(self, workflow: Workflow) -> SafeString | str:
        """The workflow's dead letters, newest first, linked to their pages."""
        root_id = workflow.root_id
        letters = DeadLetter.objects.using(instance_alias(workflow))
        # options ? 'canvas': the condition of celery_outbox_dl_root_idx
        rows = letters.filter(
            Q(options__canvas__root_id=root_id) | Q(task_id=root_id), options__has_key="canvas"
        )
        return steps_table(
            rows.order_by("-failed_at", "-id").only(
                "task_name", "task_id", "status", "exception_type", "failed_at"
            ),
            [_("task name"), _("task id"), _("status"), _("exception type"), _("failed at")],
            lambda r: (
                r.task_name,
                admin_link(r, r.task_id),
                r.get_status_display(),
                r.exception_type,
                _when(r.failed_at),
            ),
        )

    @admin.display(description=_("pending"))
    def pending_steps(self, workflow: Workflow) -> SafeString | str:
        """The workflow's outbox rows waiting to be published, oldest first, linked."""
        rows = OutboxMessage.objects.using(instance_alias(workflow)).pending()
        return steps_table(  # along celery_outbox_pending_root_idx
            rows.filter(options__headers__root_id=workflow.root_id)
            .order_by("id")
            .only("task_name", "task_id", "available_at"),
            [_("task name"), _("task id"), _("due at")],
            lambda r: (r.task_name, admin_link(r, r.task_id), _when(r.available_at)),
        )

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        """The workflow of exactly that root id (one index lookup)."""
        term = search_term.strip()
        return (queryset.filter(root_id=term) if term else queryset), False
