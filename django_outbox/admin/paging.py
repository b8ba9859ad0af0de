"""Changelists that stay fast on large tables: bounded counts and bounded filter choices.

A changelist counts its rows for the paginator, and Django's ``list_filter`` on a field
lists every distinct value: both read the whole table. Here the paginator counts at most
:data:`EXACT_UP_TO` rows and gives PostgreSQL's planner estimate beyond (the page says
"about N", or "more than N" where there is no estimate), a value filter offers the values
of the newest :data:`RECENT_ROWS` rows, and a time filter offers fixed windows back from
now (:data:`TIME_WINDOWS`), each one range of an index.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.translation import gettext_lazy as _

from celery_outbox.store.counts import Count
from django_outbox.admin.counts import bounded_count

if TYPE_CHECKING:
    from django.utils.functional import _StrPromise  # django-stubs' lazy string

#: Rows a page of the admin counts exactly; above it, the planner's estimate.
EXACT_UP_TO = 10_000

#: Rows, newest first, whose values a value filter offers.
RECENT_ROWS = 10_000

#: A time filter's windows: its value in the URL, its label, and how far back from now
#: it reaches; the last is everything older than the longest.
TIME_WINDOWS = (
    ("1h", _("Last hour"), timedelta(hours=1)),
    ("24h", _("Last 24 hours"), timedelta(hours=24)),
    ("7d", _("Last 7 days"), timedelta(days=7)),
    ("older", _("Older than 7 days"), timedelta(days=7)),
)


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
    :data:`RECENT_ROWS` rows (a value given in the URL filters whether offered or not).
    """

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


def time_window_filter(
    field: str, title: str | _StrPromise, *, leading: tuple[str, Sequence[str]]
) -> type[admin.SimpleListFilter]:
    """A filter on the time ``field`` offering :data:`TIME_WINDOWS` (``?<field>_within=1h``;
    a bookmark keeps meaning "the last hour").

    ``leading`` is the first column of the index on ``(column, field)`` and every value
    that column takes: the filter adds ``column IN (values)``, true of every row, so the
    window is read as one range of that index per value instead of a scan of the table.
    """
    column, values = leading

    class TimeWindow(admin.SimpleListFilter):
        parameter_name = f"{field}_within"

        def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
            return [(value, label) for value, label, _span in TIME_WINDOWS]

        def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
            window = {value: (value == "older", span) for value, _label, span in TIME_WINDOWS}
            chosen = self.value()
            if chosen is None or chosen not in window:
                return queryset
            older, span = window[chosen]
            bound = {f"{field}__{'lt' if older else 'gte'}": timezone.now() - span}
            windowed: QuerySet[Any] = queryset.filter(**{f"{column}__in": list(values)}, **bound)
            return windowed

    TimeWindow.title = title
    TimeWindow.__name__ = f"{field.title().replace('_', '')}WindowFilter"
    return TimeWindow
