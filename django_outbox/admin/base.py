"""The base of the outbox admins: read-only, and changelists that load only what they show.

A changelist page used to load every column of its rows: a page of 100 dead letters with
3 MB arguments took the server from 126 MB to 669 MB. :class:`ReadOnlyAdmin` defers the
columns named in ``list_deferred`` on the changelist (and the querysets its actions get)
and loads only the first :data:`HEAD_CHARS` characters of the text columns a list column
abbreviates (``list_heads``). Detail pages load whole rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.db.models.functions import Left
from django.http import HttpRequest
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.text import Truncator
from django.utils.translation import gettext as _

from django_outbox.admin.actions import UserMessage
from django_outbox.admin.paging import BoundedPaginator

#: Characters of a deferred text column a changelist loads to show its first line.
HEAD_CHARS = 320
#: Characters of a message or error shown in a changelist column (the rest on hover).
SHORT_TEXT = 80
#: A value longer than this many lines, or :data:`FOLD_CHARS` characters, is folded
#: (``<details>``) on a row's page, its summary showing where it starts (or ends).
FOLD_LINES = 12
FOLD_CHARS = 2000


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

    class Media:
        # A static style sheet, no inline style: the pages keep their look under a
        # Content-Security-Policy of style-src 'self'.
        css = {"all": ("django_outbox/outbox.css",)}

    #: Counts bounded, estimated beyond (:mod:`django_outbox.admin.paging`).
    paginator = BoundedPaginator
    show_full_result_count = False
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


def folded(text: str, *, summary_from_end: bool = False) -> SafeString:
    """``text`` escaped in a ``<pre>``; folded in a ``<details>`` when long, the summary
    its first line (or, ``summary_from_end``, its last: a traceback's exception).
    """
    lines = text.strip().splitlines()
    if len(lines) <= FOLD_LINES and len(text) <= FOLD_CHARS:
        return preformatted(text)
    shown = (lines[-1] if summary_from_end else lines[0]) if lines else ""
    size = _("%(lines)d lines, %(chars)d characters") % {"lines": len(lines), "chars": len(text)}
    return format_html(
        '<details class="outbox-fold"><summary><code>{}</code> ({})</summary>{}</details>',
        Truncator(shown).chars(SHORT_TEXT * 2),
        size,
        preformatted(text),
    )


def pretty_json(value: Any) -> SafeString:
    """``value`` as indented JSON, escaped and folded when long."""
    return folded(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=repr))


def shorten(text: str) -> str:
    """The first line of ``text``, cut to :data:`SHORT_TEXT` characters."""
    first_line = text.strip().splitlines()[0] if text.strip() else ""
    return Truncator(first_line).chars(SHORT_TEXT)


def clipped(text: str, *, hover: str | None = None, narrow: bool = False) -> SafeString:
    """The first line of ``text`` in at most two lines of a narrow column (cut by CSS), and
    ``hover`` (default: the whole ``text`` as loaded) on hover, both escaped.
    """
    return format_html(
        '<span class="outbox-clip{}" title="{}">{}</span>',
        " outbox-narrow" if narrow else "",
        text if hover is None else hover,
        shorten(text),
    )


def id_cell(value: str, *, wide: bool = False) -> SafeString:
    """An id (task or root id) in monospace, at most three lines of a narrow column (a
    uuid fills them; ``wide``: two lines, a uuid takes one), whole on hover, escaped.
    """
    return format_html(
        '<span class="outbox-id{}" title="{}">{}</span>',
        " outbox-wide" if wide else "",
        value,
        value,
    )


def short_time(value: datetime | None) -> SafeString | str:
    """``value`` in the current time zone as two unbreakable parts, ``2026-03-04`` and
    ``05:06:07`` (two lines at most), the full value on hover; ``-`` for ``None``.
    """
    if value is None:
        return "-"
    local = timezone.localtime(value)
    return format_html(
        '<span class="outbox-time" title="{}"><span>{}</span> <span>{}</span></span>',
        local.isoformat(),
        date_format(local, "Y-m-d"),
        date_format(local, "H:i:s"),
    )
