"""The admin of completed atomic tasks: a read-only list of ``CompletedTask`` rows.

The table holds one row per atomic task run for ``outbox_keep_completed`` (millions on a
busy site), so the list loads no ``result``, shows no full count, and the search is an
exact task id (the unique index), not a scan.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from django_outbox.admin.base import ReadOnlyAdmin, clipped, id_cell, preformatted, short_time
from django_outbox.admin.paging import recent_values_filter
from django_outbox.models import CompletedTask


@admin.register(CompletedTask)
class CompletedTaskAdmin(ReadOnlyAdmin):
    """Atomic tasks that committed: find a task id, see when it ran and what it returned."""

    # Three compact columns at 1280 x 800: the task id on one line (a uuid; a longer id
    # is cut at two, whole on hover), the name cut to two lines, the time in two parts.
    list_display = ("task", "name", "completed")
    list_filter = (recent_values_filter("task_name", "task name"), "completed_at")
    search_fields = ("task_id",)
    search_help_text = _("An exact task id.")
    ordering = ("-completed_at", "-id")
    # The columns an index orders (the name's would sort every row of a frequent task).
    sortable_by = ("task", "completed")
    show_full_result_count = False
    list_deferred = ("result",)
    readonly_fields = ("task_id", "task_name", "completed_at", "result_block")
    fields = readonly_fields

    @admin.display(description=_("task id"), ordering="task_id")
    def task(self, row: CompletedTask) -> SafeString:
        """The task id in monospace, at most two lines; in full on hover."""
        return id_cell(row.task_id, wide=True)

    @admin.display(description=_("task name"))
    def name(self, row: CompletedTask) -> SafeString:
        """The task name in two lines at most; in full on hover."""
        return clipped(row.task_name)

    @admin.display(description=_("completed at"), ordering="completed_at")
    def completed(self, row: CompletedTask) -> SafeString | str:
        """``completed_at``, short."""
        return short_time(row.completed_at)

    @admin.display(description=_("result"))
    def result_block(self, row: CompletedTask) -> SafeString | str:
        """The stored return value (the task's serializer), escaped; ``-`` for ``None``."""
        return "-" if row.result is None else preformatted(row.result)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        """The row of exactly that task id (one index lookup)."""
        term = search_term.strip()
        return (queryset.filter(task_id=term) if term else queryset), False
