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

from django_outbox.admin_base import ReadOnlyAdmin, preformatted
from django_outbox.admin_paging import recent_values_filter
from django_outbox.models import CompletedTask


@admin.register(CompletedTask)
class CompletedTaskAdmin(ReadOnlyAdmin):
    """Atomic tasks that committed: find a task id, see when it ran and what it returned."""

    list_display = ("task_id", "task_name", "completed_at")
    list_filter = (recent_values_filter("task_name", "task name"), "completed_at")
    search_fields = ("task_id",)
    search_help_text = _("An exact task id.")
    ordering = ("-completed_at", "-id")
    show_full_result_count = False
    list_deferred = ("result",)
    readonly_fields = ("task_id", "task_name", "completed_at", "result_block")
    fields = readonly_fields

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
