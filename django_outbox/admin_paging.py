"""Changelists that stay fast on large tables: bounded counts and bounded filter choices.

A changelist counts its rows for the paginator, and Django's ``list_filter`` on a field
lists every distinct value: both read the whole table. Here the paginator counts at most
:data:`~celery_outbox.estimates.EXACT_UP_TO` rows and gives PostgreSQL's planner
estimate beyond (the page says "about N", or "more than N" where there is no estimate),
and a value filter offers the values of the newest :data:`RECENT_ROWS` rows.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.functional import cached_property

from celery_outbox.estimates import EXACT_UP_TO
from django_outbox.bounded_counts import Count, bounded_count

#: Rows, newest first, whose values a value filter offers.
RECENT_ROWS = 10_000


class BoundedPaginator(Paginator):  # type: ignore[type-arg]
    """A paginator whose count reads at most ``EXACT_UP_TO + 1`` rows (see the module)."""

    counted: Count | None = None

    @cached_property
    def count(self) -> int:
        """Exact up to the bound, else an estimate (``counted`` says which)."""
        rows: QuerySet[Any] = self.object_list  # type: ignore[assignment]  # a changelist's
        self.counted = bounded_count(rows, EXACT_UP_TO)
        return self.counted.value


def recent_values_filter(field: str, title: str) -> type[admin.SimpleListFilter]:
    """A filter on ``field`` offering the distinct values of the newest
    :data:`RECENT_ROWS` rows (a value given in the URL filters whether offered or not)."""

    class RecentValues(admin.SimpleListFilter):
        parameter_name = field

        def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
            rows = model_admin.get_queryset(request).order_by("-pk")
            newest = rows.values_list(field, flat=True)[:RECENT_ROWS]  # along the primary key
            return [(value, value) for value in sorted(set(newest))]

        def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
            value = self.value()
            return queryset if value is None else queryset.filter(**{field: value})

    RecentValues.title = title
    RecentValues.__name__ = f"Recent{field.title().replace('_', '')}Filter"
    return RecentValues
