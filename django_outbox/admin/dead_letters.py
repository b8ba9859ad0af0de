"""The Django admin of the outbox: dead letters here, read-only (the outbox messages:
:mod:`django_outbox.admin.messages`; the completed atomic tasks,
:mod:`django_outbox.admin.completed`; the workflows, :mod:`django_outbox.admin.workflows`).

Nothing here edits a row directly. The actions keep only rows in a state they apply to,
delegate to :mod:`django_outbox.admin.actions` (and from there to the core), and report
counts with ``message_user``. Each dead-letter action is shown only to users holding its
permission (``django_outbox.requeue_deadletter``, ``django_outbox.discard_deadletter``),
on the list and as a button on a dead letter's page (:mod:`django_outbox.admin.buttons`).
Payload data is always escaped (``format_html``), never marked safe.
"""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from celery_outbox.store.records import DeadLetterStatus
from django_outbox._compat import instance_alias
from django_outbox.admin import actions as admin_actions
from django_outbox.admin.actions import LetterGroupKey
from django_outbox.admin.base import clipped, folded, head, pretty_json, short_time
from django_outbox.admin.buttons import RowAction, RowActionsAdmin
from django_outbox.admin.completed import CompletedTaskAdmin
from django_outbox.admin.messages import OutboxMessageAdmin
from django_outbox.admin.overview import OverviewAdmin, letters_url
from django_outbox.admin.paging import recent_values_filter, time_window_filter
from django_outbox.admin.workflows import WorkflowAdmin, admin_link, letter_workflow
from django_outbox.dead_letters import discard_letters, requeue_letters
from django_outbox.models import CompletedTask, DeadLetter, DeadLetterQuerySet, OutboxMessage

__all__ = [
    "CompletedTaskAdmin",
    "DeadLetterAdmin",
    "OutboxMessageAdmin",
    "OverviewAdmin",
    "WorkflowAdmin",
]


#: Every status a dead letter takes (the first column of its ``status, failed_at`` index).
DEAD_LETTER_STATUSES = tuple(status.value for status in DeadLetterStatus)


def is_dead(letter: DeadLetter) -> bool:
    """Whether ``letter`` may still be requeued or discarded."""
    return letter.status == DeadLetterStatus.DEAD.value


def task_row_link(task_id: str, *, using: str) -> SafeString | str:
    """A link to what became of task ``task_id``: its pending or failed outbox row, its
    completed-task row (atomic tasks), or its own dead letter; the id alone when the
    outbox published it and kept nothing (``-`` without an id).
    """
    if not task_id:
        return "-"
    for model in (OutboxMessage, CompletedTask, DeadLetter):
        row = model._default_manager.using(using).filter(task_id=task_id).order_by("-pk")
        found = row.only("pk").first()
        if found is not None:
            return admin_link(found, f"{task_id} ({model._meta.verbose_name})")
    return task_id


@admin.register(DeadLetter)
class DeadLetterAdmin(RowActionsAdmin):
    """Dead letters: inspect them, then requeue or discard the ``dead`` ones."""

    # Five compact columns: at 1280 x 800 the navigation and the filters leave the list
    # about 630 pixels. The task id, retries and first failure are on a letter's page
    # (and the task id on hover over the name).
    list_display = ("name", "status", "exception", "short_message", "failed")
    list_filter = (
        "status",
        recent_values_filter("task_name", "task name"),
        recent_values_filter("exception_type", "exception type"),
        # One range of celery_outbox_dl_status_failed_idx (status, failed_at) per status.
        # Django's date filter would range over failed_at alone, which no index leads.
        time_window_filter(
            "failed_at", _("failure time"), leading=("status", DEAD_LETTER_STATUSES)
        ),
    )
    search_fields = ("task_id", "exception_message")
    # Newest first along the primary key (a letter is written when it fails). No column
    # sorts: no index gives their order, so a click would sort the whole table for one
    # page (0.2-0.4 s over 100,000 letters); the filters narrow the list instead.
    ordering = ("-id",)
    sortable_by = ()
    actions = ("requeue_selected", "discard_selected")
    row_actions = (
        RowAction(
            name="requeue", label=_("Requeue"), run="requeue_selected", permission="requeue",
            applies=is_dead,
        ),
        RowAction(
            name="discard", label=_("Discard"), run="discard_selected", permission="discard",
            applies=is_dead, confirm=_("Discard this dead letter? It will not be requeued."),
        ),
    )  # fmt: skip
    list_deferred = ("args", "kwargs", "options", "traceback", "exception_message")
    list_heads = {"message_head": "exception_message"}
    readonly_fields = (
        "task_name",
        "task_id",
        "status",
        "workflow",
        "exception_type",
        "group",
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
        "requeued_task",
    )
    fieldsets = (
        (None, {"fields": ("task_name", "task_id", "status", "workflow")}),
        (
            _("Failure"),
            {
                "fields": (
                    "exception_type",
                    "group",
                    "message_block",
                    "retries",
                    "first_failed_at",
                    "failed_at",
                    "traceback_block",
                )
            },
        ),
        (_("Call"), {"fields": ("args_json", "kwargs_json", "options_json")}),
        (_("Requeue"), {"fields": ("requeued_at", "requeued_by", "requeued_task")}),
    )

    @admin.display(description=_("task name"))
    def name(self, letter: DeadLetter) -> SafeString:
        """The task name in two lines at most; in full, with the task id, on hover."""
        return clipped(letter.task_name, hover=f"{letter.task_name}\n{letter.task_id}")

    @admin.display(description=_("exception type"))
    def exception(self, letter: DeadLetter) -> SafeString:
        """The exception's class name, its dotted path on hover."""
        short = letter.exception_type.rpartition(".")[2] or letter.exception_type
        return clipped(short, hover=letter.exception_type, narrow=True)

    @admin.display(description=_("message"))
    def short_message(self, letter: DeadLetter) -> SafeString:
        """The exception message's first line, cut; on hover its first
        :data:`~django_outbox.admin.base.HEAD_CHARS` characters (all of it on the page).
        """
        return clipped(head(letter, "message_head", "exception_message"))

    @admin.display(description=_("failed at"))
    def failed(self, letter: DeadLetter) -> SafeString | str:
        """``failed_at``, short."""
        return short_time(letter.failed_at)

    @admin.display(description=_("requeued task id"))
    def requeued_task(self, letter: DeadLetter) -> SafeString | str:
        """The requeued task's id, linked to its outbox row, completed task or dead letter."""
        return task_row_link(letter.requeued_task_id, using=instance_alias(letter))

    @admin.display(description=_("workflow"))
    def workflow(self, letter: DeadLetter) -> SafeString | str:
        """A link to the workflow the task is a step of (``-`` outside one)."""
        return letter_workflow(letter)

    @admin.display(description=_("group"))
    def group(self, letter: DeadLetter) -> SafeString:
        """A link to the letter's group: the ``dead`` letters of its task that failed with
        its exception type (a group of the overview, which *Requeue group* acts on).
        """
        key = LetterGroupKey(
            task_name=letter.task_name, exception_type=letter.exception_type, upto=letter.pk
        )
        text = _("The dead letters of this task with this exception type")
        return format_html('<a href="{}" class="outbox-group-link">{}</a>', letters_url(key), text)

    @admin.display(description=_("exception message"))
    def message_block(self, letter: DeadLetter) -> SafeString:
        """The whole exception message, escaped, folded when long."""
        return folded(letter.exception_message)

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
        """The traceback, escaped, folded when long (its summary the exception line)."""
        return folded(letter.traceback, summary_from_end=True)

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
