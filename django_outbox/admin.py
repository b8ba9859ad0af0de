"""The Django admin of the outbox: dead letters and outbox messages, both read-only (and
the completed atomic tasks, :mod:`django_outbox.admin_completed`, and the workflows,
:mod:`django_outbox.admin_workflows`).

Nothing here edits a row directly. The actions keep only rows in a state they apply to,
delegate to :mod:`django_outbox.admin_actions` (and from there to the core), and report
counts with ``message_user``. Each dead-letter action is shown only to users holding its
permission (``django_outbox.requeue_deadletter``, ``django_outbox.discard_deadletter``);
the outbox-message actions need ``django_outbox.change_outboxmessage``. Payload data is
always escaped (``format_html``), never marked safe.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.safestring import SafeString
from django.utils.text import Truncator
from django.utils.translation import gettext_lazy as _

from celery_outbox.envelope import decode_body
from django_outbox import admin_actions
from django_outbox.admin_base import ReadOnlyAdmin, head, preformatted
from django_outbox.admin_completed import CompletedTaskAdmin
from django_outbox.admin_overview import OverviewAdmin
from django_outbox.admin_workflows import WorkflowAdmin, letter_workflow
from django_outbox.dead_letters import discard_letters, requeue_letters
from django_outbox.models import (
    DeadLetter,
    DeadLetterQuerySet,
    OutboxMessage,
    OutboxMessageQuerySet,
)

__all__ = [
    "CompletedTaskAdmin",
    "DeadLetterAdmin",
    "OutboxMessageAdmin",
    "OverviewAdmin",
    "WorkflowAdmin",
]

#: Characters of a message or error shown in a changelist column.
SHORT_TEXT = 80

#: Content types whose payload the admin decodes for display (never pickle).
DECODABLE_CONTENT_TYPES = frozenset({"application/json"})

#: Largest inflated payload the admin decodes for display (a compressed row beyond it is
#: shown undecoded rather than inflated in the web process).
MAX_DECODED_BYTES = 16 * 1024 * 1024


def pretty_json(value: Any) -> SafeString:
    """``value`` as indented JSON in an escaped ``<pre>``."""
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=repr)
    return preformatted(text)


def shorten(text: str) -> str:
    """The first line of ``text``, cut to :data:`SHORT_TEXT` characters."""
    first_line = text.strip().splitlines()[0] if text.strip() else ""
    return Truncator(first_line).chars(SHORT_TEXT)


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


@admin.register(DeadLetter)
class DeadLetterAdmin(ReadOnlyAdmin):
    """Dead letters: inspect them, then requeue or discard the ``dead`` ones."""

    list_display = (
        "task_name",
        "status",
        "exception_type",
        "short_message",
        "retries",
        "first_failed_at",
        "failed_at",
        "task_id",
    )
    list_filter = ("status", "task_name", "exception_type", "failed_at")
    search_fields = ("task_id", "exception_message")
    date_hierarchy = "failed_at"
    ordering = ("-failed_at", "-id")
    actions = ("requeue_selected", "discard_selected")
    list_deferred = ("args", "kwargs", "options", "traceback", "exception_message")
    list_heads = {"message_head": "exception_message"}
    readonly_fields = (
        "task_name",
        "task_id",
        "status",
        "workflow",
        "exception_type",
        "message_block",
        "retries",
        "first_failed_at",
        "failed_at",
        "args_json",
        "kwargs_json",
        "options_json",
        "traceback_block",
        "requeued_at",
        "requeued_by",
        "requeued_task_id",
    )
    fieldsets = (
        (None, {"fields": ("task_name", "task_id", "status", "workflow")}),
        (
            _("Failure"),
            {
                "fields": (
                    "exception_type",
                    "message_block",
                    "retries",
                    "first_failed_at",
                    "failed_at",
                    "traceback_block",
                )
            },
        ),
        (_("Call"), {"fields": ("args_json", "kwargs_json", "options_json")}),
        (_("Requeue"), {"fields": ("requeued_at", "requeued_by", "requeued_task_id")}),
    )

    @admin.display(description=_("message"), ordering="exception_message")
    def short_message(self, letter: DeadLetter) -> str:
        """The exception message's first line, shortened (escaped by the changelist)."""
        return shorten(head(letter, "message_head", "exception_message"))

    @admin.display(description=_("workflow"))
    def workflow(self, letter: DeadLetter) -> SafeString | str:
        """A link to the workflow the task is a step of (``-`` outside one)."""
        return letter_workflow(letter)

    @admin.display(description=_("exception message"))
    def message_block(self, letter: DeadLetter) -> SafeString:
        """The whole exception message, escaped."""
        return preformatted(letter.exception_message)

    @admin.display(description=_("args"))
    def args_json(self, letter: DeadLetter) -> SafeString:
        """The positional arguments as escaped, indented JSON."""
        return pretty_json(letter.args)

    @admin.display(description=_("kwargs"))
    def kwargs_json(self, letter: DeadLetter) -> SafeString:
        """The keyword arguments as escaped, indented JSON."""
        return pretty_json(letter.kwargs)

    @admin.display(description=_("options"))
    def options_json(self, letter: DeadLetter) -> SafeString:
        """The routing options as escaped, indented JSON."""
        return pretty_json(letter.options)

    @admin.display(description=_("traceback"))
    def traceback_block(self, letter: DeadLetter) -> SafeString:
        """The traceback, escaped."""
        return preformatted(letter.traceback)

    def has_requeue_permission(self, request: HttpRequest) -> bool:
        """Whether the user may requeue dead letters."""
        return request.user.has_perm("django_outbox.requeue_deadletter")

    def has_discard_permission(self, request: HttpRequest) -> bool:
        """Whether the user may discard dead letters."""
        return request.user.has_perm("django_outbox.discard_deadletter")

    @admin.action(description=_("Requeue selected dead letters"), permissions=["requeue"])
    def requeue_selected(self, request: HttpRequest, queryset: DeadLetterQuerySet) -> None:
        """Requeue the selected ``dead`` letters as new tasks."""
        result = requeue_letters(queryset, by=admin_actions.actor_name(request.user))
        self.report(request, admin_actions.requeue_messages(result))

    @admin.action(description=_("Discard selected dead letters"), permissions=["discard"])
    def discard_selected(self, request: HttpRequest, queryset: DeadLetterQuerySet) -> None:
        """Mark the selected ``dead`` letters discarded."""
        selected = queryset.count()
        discarded = discard_letters(queryset)
        self.report(request, admin_actions.discard_messages(selected, discarded))


@admin.register(OutboxMessage)
class OutboxMessageAdmin(ReadOnlyAdmin):
    """Outbox rows waiting to be published (``pending``) or given up on (``failed``)."""

    list_display = (
        "id",
        "task_name",
        "task_id",
        "status",
        "attempts",
        "available_at",
        "created_at",
        "short_error",
    )
    list_filter = ("status", "task_name")
    search_fields = ("task_id",)
    ordering = ("-id",)
    actions = ("publish_now", "reset_failed")
    list_deferred = ("payload", "options", "last_error")
    list_heads = {"error_head": "last_error"}
    readonly_fields = (
        "task_name",
        "task_id",
        "status",
        "available_at",
        "attempts",
        "error_block",
        "locked_until",
        "created_at",
        "published_at",
        "body_json",
        "options_json",
        "payload_block",
    )
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "task_name",
                    "task_id",
                    "status",
                    "available_at",
                    "created_at",
                    "published_at",
                )
            },
        ),
        (_("Publishing"), {"fields": ("attempts", "error_block", "locked_until")}),
        (_("Message"), {"fields": ("body_json", "options_json", "payload_block")}),
    )

    @admin.display(description=_("last error"))
    def short_error(self, row: OutboxMessage) -> str:
        """The last publish error's first line, shortened."""
        return shorten(head(row, "error_head", "last_error"))

    @admin.display(description=_("last error"))
    def error_block(self, row: OutboxMessage) -> SafeString:
        """The last publish error, escaped."""
        return preformatted(row.last_error)

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
        """The stored payload, escaped."""
        return preformatted(row.payload)

    def has_publish_permission(self, request: HttpRequest) -> bool:
        """Whether the user may publish or reset outbox rows (their change permission)."""
        return request.user.has_perm("django_outbox.change_outboxmessage")

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
