"""The admin of outbox rows: the pending, parked and failed messages, read-only.

The list's actions publish now and reset (the change permission,
``django_outbox.change_outboxmessage``) and cancel (``django_outbox.cancel_outboxmessage``,
:mod:`django_outbox.cancelling`); a row's page has the same three as buttons
(:mod:`django_outbox.admin.buttons`) and says when a parked retry is due and why it was
parked. Payload data is always escaped, never marked safe.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.timesince import timesince, timeuntil
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from celery_outbox.dispatch.envelope import decode_body
from celery_outbox.store.records import MessageStatus
from celery_outbox.worker.attempt import FIRST_FAILED_HEADER
from celery_outbox.worker.republish import RETRY_REASON_HEADER
from django_outbox.admin import actions as admin_actions
from django_outbox.admin.base import (
    clipped,
    folded,
    head,
    pretty_json,
    short_time,
)
from django_outbox.admin.buttons import RowAction, RowActionsAdmin
from django_outbox.admin.paging import recent_values_filter
from django_outbox.cancelling import cancel_messages
from django_outbox.models import OutboxMessage, OutboxMessageQuerySet

#: Content types whose payload the admin decodes for display (never pickle).
DECODABLE_CONTENT_TYPES = frozenset({"application/json"})

#: Largest inflated payload the admin decodes for display (a compressed row beyond it is
#: shown undecoded rather than inflated in the web process).
MAX_DECODED_BYTES = 16 * 1024 * 1024


def decoded_payload(row: OutboxMessage) -> Any:
    """The message body ``(args, kwargs, embed)`` of a JSON payload, else ``None``.

    Other serializers are not decoded: unpickling data from the database in the web
    process would run whatever code it names.
    """
    options = row.options or {}
    if options.get("content_type") not in DECODABLE_CONTENT_TYPES:
        return None
    try:
        return decode_body(
            row.payload, options, accept=DECODABLE_CONTENT_TYPES, max_bytes=MAX_DECODED_BYTES
        )
    except (ValueError, TypeError, KeyError):
        return None


def is_pending(row: OutboxMessage) -> bool:
    """Whether ``row`` waits to be published (due now or parked)."""
    return row.status == MessageStatus.PENDING.value


def is_parked(row: OutboxMessage) -> bool:
    """Whether ``row`` is pending and due later than it was written (a parked retry, or
    a countdown beyond ``outbox_park_after``).
    """
    return is_pending(row) and row.available_at > row.created_at


def schedule_lines(row: OutboxMessage) -> list[str]:
    """What a row's page says about when the row is published, and why it waits."""
    now = timezone.now()
    if not is_pending(row):
        return [gettext("Not waiting: %(status)s.") % {"status": row.get_status_display()}]
    due = date_format(timezone.localtime(row.available_at), "Y-m-d H:i:s")
    if row.available_at <= now:
        late = timesince(row.available_at, now)
        lines = [gettext("Due since %(due)s (%(late)s ago).") % {"due": due, "late": late}]
    else:
        left = timeuntil(row.available_at, now)
        lines = [gettext("Due at %(due)s (in %(left)s).") % {"due": due, "left": left}]
    if is_parked(row):
        lines.append(parked_reason(row.options or {}))
    return lines


def parked_reason(options: dict[str, Any]) -> str:
    """Why a parked row waits: the retry, its error and its first failure, or a countdown."""
    headers = options.get("headers") or {}
    retries = headers.get("retries") or 0
    if not retries:
        return gettext("Parked: dispatched with a countdown or eta longer than outbox_park_after.")
    return gettext(
        "Parked retry %(retries)s: its wait is longer than outbox_park_after. "
        "Reason: %(reason)s. First failed: %(first)s."
    ) % {
        "retries": retries,
        "reason": headers.get(RETRY_REASON_HEADER) or gettext("not recorded"),
        "first": headers.get(FIRST_FAILED_HEADER) or "-",
    }


@admin.register(OutboxMessage)
class OutboxMessageAdmin(RowActionsAdmin):
    """Outbox rows waiting to be published (``pending``) or given up on (``failed``)."""

    # Five compact columns (about 630 pixels are left at 1280 x 800); the row id, task id
    # and creation time are on the row's page (the task id on hover over the name).
    list_display = ("name", "status", "attempts", "due", "short_error")
    list_filter = ("status", recent_values_filter("task_name", "task name"))
    search_fields = ("task_id",)
    # Newest first along the primary key. No column sorts: no index gives their order
    # (a click sorted all 1,000,000 rows of the benchmark's table: 0.4-0.9 s).
    ordering = ("-id",)
    sortable_by = ()
    actions = ("publish_now", "reset_failed", "cancel_selected")
    list_deferred = ("payload", "options", "last_error")
    list_heads = {"error_head": "last_error"}
    row_actions = (
        RowAction(
            name="publish", label=_("Publish now"), run="publish_now", permission="publish",
            applies=is_pending,
        ),
        RowAction(
            name="reset", label=_("Reset"), run="reset_failed", permission="publish",
            applies=lambda row: row.status == MessageStatus.FAILED.value,
        ),
        RowAction(
            name="cancel", label=_("Cancel"), run="cancel_selected", permission="cancel",
            applies=is_pending,
            confirm=_("Cancel this message? It is deleted, never published, and revoked."),
        ),
    )  # fmt: skip
    readonly_fields = (
        "task_name",
        "task_id",
        "status",
        "schedule",
        "available_at",
        "created_at",
        "published_at",
        "attempts",
        "error_block",
        "locked_until",
        "body_json",
        "options_json",
        "payload_block",
    )
    fieldsets = (
        (None, {"fields": readonly_fields[:7]}),
        (_("Publishing"), {"fields": ("attempts", "error_block", "locked_until")}),
        (_("Message"), {"fields": ("body_json", "options_json", "payload_block")}),
    )

    @admin.display(description=_("task name"))
    def name(self, row: OutboxMessage) -> SafeString:
        """The task name in two lines at most; in full, with the task id, on hover."""
        return clipped(row.task_name, hover=f"{row.task_name}\n{row.task_id}")

    @admin.display(description=_("due at"))
    def due(self, row: OutboxMessage) -> SafeString | str:
        """``available_at``, short."""
        return short_time(row.available_at)

    @admin.display(description=_("last error"))
    def short_error(self, row: OutboxMessage) -> SafeString:
        """The last publish error's first line, cut, in full on hover."""
        return clipped(head(row, "error_head", "last_error"))

    @admin.display(description=_("schedule"))
    def schedule(self, row: OutboxMessage) -> SafeString:
        """When the row is published, and why a parked row waits."""
        lines = format_html_join("", "<p>{}</p>", ((line,) for line in schedule_lines(row)))
        return format_html('<div class="outbox-schedule">{}</div>', lines)

    @admin.display(description=_("last error"))
    def error_block(self, row: OutboxMessage) -> SafeString:
        """The last publish error, escaped, folded when long."""
        return folded(row.last_error, summary_from_end=True)

    @admin.display(description=_("body (args, kwargs, embed)"))
    def body_json(self, row: OutboxMessage) -> SafeString | str:
        """The decoded JSON body, escaped; a note for other serializers."""
        body = decoded_payload(row)
        return "-" if body is None else pretty_json(body)

    @admin.display(description=_("options"))
    def options_json(self, row: OutboxMessage) -> SafeString:
        """Headers, properties and routing as escaped, indented JSON."""
        return pretty_json(row.options)

    @admin.display(description=_("payload (as stored)"))
    def payload_block(self, row: OutboxMessage) -> SafeString:
        """The stored payload, escaped, folded when long."""
        return folded(row.payload)

    def has_publish_permission(self, request: HttpRequest) -> bool:
        """Whether the user may publish or reset outbox rows (their change permission)."""
        return request.user.has_perm("django_outbox.change_outboxmessage")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        """Whether the user may cancel pending outbox rows."""
        return request.user.has_perm("django_outbox.cancel_outboxmessage")

    @admin.action(description=_("Publish selected pending messages now"), permissions=["publish"])
    def publish_now(self, request: HttpRequest, queryset: OutboxMessageQuerySet) -> None:
        """Make the selected pending rows due now and publish them after commit."""
        selected = queryset.count()
        changed = admin_actions.publish_messages_now(queryset)
        self.report(request, admin_actions.publish_now_messages(selected, changed))

    @admin.action(description=_("Reset selected failed messages"), permissions=["publish"])
    def reset_failed(self, request: HttpRequest, queryset: OutboxMessageQuerySet) -> None:
        """Make the selected failed rows pending again with a fresh attempt budget."""
        selected = queryset.count()
        changed = admin_actions.reset_failed_messages(queryset)
        self.report(request, admin_actions.reset_messages(selected, changed))

    @admin.action(description=_("Cancel selected pending messages"), permissions=["cancel"])
    def cancel_selected(self, request: HttpRequest, queryset: OutboxMessageQuerySet) -> None:
        """Delete the selected pending rows (never published), logged, their ids revoked."""
        user: Any = request.user
        self.report(request, admin_actions.cancel_report(cancel_messages(queryset, by=user)))
