"""The base of the outbox admins: read-only, and changelists that load only what they show.

A changelist page used to load every column of its rows: a page of 100 dead letters with
3 MB arguments took the server from 126 MB to 669 MB. :class:`ReadOnlyAdmin` defers the
columns named in ``list_deferred`` on the changelist (and the querysets its actions get)
and loads only the first :data:`HEAD_CHARS` characters of the text columns a list column
abbreviates (``list_heads``). Detail pages load whole rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.db.models.functions import Left
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString

from django_outbox.admin_actions import UserMessage

#: Characters of a deferred text column a changelist loads to show its first line.
HEAD_CHARS = 320


class SlimChangeList(ChangeList):
    """A changelist whose queryset defers its admin's ``list_deferred`` columns."""

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet[Any]:
        """The admin's changelist queryset without the large columns."""
        queryset: QuerySet[Any] = super().get_queryset(request, exclude_parameters)
        deferred: tuple[str, ...] = getattr(self.model_admin, "list_deferred", ())
        heads: Mapping[str, str] = getattr(self.model_admin, "list_heads", {})
        loaded = {name: Left(column, HEAD_CHARS) for name, column in heads.items()}
        slim: QuerySet[Any] = queryset.defer(*deferred).annotate(**loaded)
        return slim


class ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """No add, change or delete: rows change only through the actions."""

    #: Columns a changelist never loads (large, shown on the detail page only).
    list_deferred: tuple[str, ...] = ()
    #: ``{attribute: column}``: the first :data:`HEAD_CHARS` characters of a deferred
    #: text column, set on each changelist row as ``attribute``.
    list_heads: Mapping[str, str] = {}

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        """:class:`SlimChangeList`: the list loads only the columns it shows."""
        return SlimChangeList

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Never: rows are written by the outbox."""
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Never: the detail page is read-only."""
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Never: discard a dead letter, purge outbox rows with ``manage.py outbox purge``."""
        return False

    def report(self, request: HttpRequest, report: Iterable[UserMessage]) -> None:
        """Send each ``(level, text)`` of an action's report to the user."""
        for level, text in report:
            self.message_user(request, text, level=level)


def head(row: Any, attribute: str, column: str) -> str:
    """The loaded head of ``column`` on a changelist row, else the whole column."""
    loaded: str | None = getattr(row, attribute, None)
    return getattr(row, column) if loaded is None else loaded


def preformatted(text: str) -> SafeString:
    """``text`` in a ``<pre>``, escaped."""
    return format_html('<pre class="outbox-pre">{}</pre>', text)
