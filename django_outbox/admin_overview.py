"""The admin's overview page, ``/admin/django_outbox/overview/``: is the outbox healthy?

Open to staff users who may view dead letters or outbox messages. It shows the backlog
(pending, due, parked, failed, the oldest due row's wait), the last sweep, a chart of
publishes and dead letters per hour over the last 24 hours (:mod:`django_outbox.admin_chart`),
the dead letters grouped by task and exception type, the parked rows due next and the
workflows per status, every figure read by :func:`django_outbox.overview.read_overview`.

Each group has Requeue and Discard buttons, shown only to users holding
``django_outbox.requeue_deadletter`` / ``discard_deadletter`` (and the view permission of
dead letters). A button POSTs (with the CSRF token) to a confirmation page saying what
will be done; only its own POST, with ``confirmed``, acts
(:mod:`django_outbox.letter_groups`). A POST from a user without the permission is
refused with 403, whatever it holds.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import Model
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.translation import gettext_lazy as _

from celery_outbox.config import OutboxConfig
from django_outbox import admin_actions, letter_groups
from django_outbox.admin_chart import bar_chart
from django_outbox.admin_workflows import breakable
from django_outbox.bounded_counts import HOUR_SAMPLE
from django_outbox.celery_app import outbox_app
from django_outbox.models import DeadLetter, Overview
from django_outbox.overview import (
    COUNT_CAP,
    GROUPED_LETTERS,
    LetterGroup,
    duration_text,
    read_overview,
)

#: The permissions each group action needs, beside ``view_deadletter``.
ACTION_PERMISSIONS = {
    "requeue": "django_outbox.requeue_deadletter",
    "discard": "django_outbox.discard_deadletter",
}
VIEW_LETTERS = "django_outbox.view_deadletter"
VIEW_MESSAGES = "django_outbox.view_outboxmessage"


def may_act(request: HttpRequest, action: str) -> bool:
    """Whether the user may run group ``action`` (``requeue`` or ``discard``)."""
    user = request.user
    return user.has_perm(VIEW_LETTERS) and user.has_perm(ACTION_PERMISSIONS[action])


@admin.register(Overview)
class OverviewAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """The overview page in place of a changelist, and the group actions' pages."""

    def has_view_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        """Users who may view dead letters or outbox messages."""
        user = request.user
        return bool(user.is_active and user.is_staff) and (
            user.has_perm(VIEW_LETTERS) or user.has_perm(VIEW_MESSAGES)
        )

    def has_module_permission(self, request: HttpRequest) -> bool:
        """As :meth:`has_view_permission`: the section lists the page to them."""
        return self.has_view_permission(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        """Never: there is nothing to add."""
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        """Never: there is nothing to change."""
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        """Never: there is nothing to delete."""
        return False

    def get_urls(self) -> list[URLPattern]:
        """The overview (the changelist's URL and name) and the group actions."""
        opts = self.model._meta
        name = f"{opts.app_label}_{opts.model_name}"
        wrap = self.admin_site.admin_view
        return [
            path("", wrap(self.changelist_view), name=f"{name}_changelist"),
            path("group/<str:action>/", wrap(self.group_view), name=f"{name}_group"),
        ]

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """The overview page."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        alias = DeadLetter.objects.db
        config = OutboxConfig.from_celery(outbox_app())
        overview = read_overview(alias, keeps_published=config.keep_published.total_seconds() > 0)
        show_letters = request.user.has_perm(VIEW_LETTERS)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": _("Celery outbox overview"),
            "overview": overview,
            "show_letters": show_letters,
            "may_requeue": show_letters and may_act(request, "requeue"),
            "may_discard": show_letters and may_act(request, "discard"),
            "groups": [group_row(group) for group in overview.groups],
            "count_cap": f"{COUNT_CAP:,}",
            "hour_sample": f"{HOUR_SAMPLE:,}",
            "grouped_letters": f"{GROUPED_LETTERS:,}",
            "oldest_due_age": duration_text(
                None if overview.oldest_due_at is None else overview.now - overview.oldest_due_at
            ),
            "sweep_age": duration_text(
                None if overview.last_sweep is None else overview.last_sweep.age
            ),
            "publish_chart": bar_chart(
                overview.publishes,
                title=str(_("Publishes per hour")),
                noun="published",
                colour="#417690",
            )
            if overview.keeps_published
            else None,
            "letter_chart": bar_chart(
                overview.dead_letters,
                title=str(_("Dead letters per hour")),
                noun="dead letters",
                colour="#ba2121",
            ),
            **(extra_context or {}),
        }
        return TemplateResponse(request, "django_outbox/overview.html", context)

    def group_view(self, request: HttpRequest, action: str) -> HttpResponse:
        """A group action: the confirmation page, or (a POST with ``confirmed``) the action."""
        if action not in ACTION_PERMISSIONS:
            return HttpResponseBadRequest(
                f"action={action!r} is not accepted: give requeue or discard."
            )
        if not may_act(request, action):
            raise PermissionDenied
        data = request.POST if request.method == "POST" else request.GET
        try:
            key = letter_groups.LetterGroupKey.parse(data)
        except ValueError as exc:
            return HttpResponseBadRequest(str(exc))
        alias = DeadLetter.objects.db
        if request.method == "POST" and data.get("confirmed") == "yes":
            self._act(request, action, key, alias)
            return HttpResponseRedirect(reverse("admin:django_outbox_overview_changelist"))
        count, more = letter_groups.count_group(key, using=alias)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": _("Are you sure?"),
            "action": action,
            "key": key,
            "count": count,
            "more": more,
            "batch": min(count, letter_groups.GROUP_BATCH),
            "letters_url": letters_url(key),
        }
        return TemplateResponse(request, "django_outbox/overview_confirm.html", context)

    def _act(
        self, request: HttpRequest, action: str, key: letter_groups.LetterGroupKey, alias: str
    ) -> None:
        if action == "requeue":
            by = admin_actions.actor_name(request.user)
            result = letter_groups.requeue_group(key, by=by, using=alias)
            report = admin_actions.requeue_messages(result)
        else:
            selected, discarded = letter_groups.discard_group(key, using=alias)
            report = admin_actions.discard_messages(selected, discarded)
        for level, text in report:
            self.message_user(request, text, level=level)


def group_row(group: LetterGroup) -> dict[str, Any]:
    """A group of the page, its key (``upto``: its newest letter) and its links."""
    key = letter_groups.LetterGroupKey(
        task_name=group.task_name, exception_type=group.exception_type, upto=group.sample_id
    )
    sample = reverse("admin:django_outbox_deadletter_change", args=[group.sample_id])
    return {
        "group": group,
        "key": key,
        "letters_url": letters_url(key),
        "sample_url": sample,
        "task_html": breakable(group.task_name),
        "exception_html": breakable(group.exception_type),
    }


def letters_url(key: letter_groups.LetterGroupKey) -> str:
    """The dead-letter list filtered to the ``dead`` letters of ``key``'s group."""
    query = urlencode(
        {
            "status__exact": "dead",
            "task_name": key.task_name,
            "exception_type": key.exception_type,
        }
    )
    return reverse("admin:django_outbox_deadletter_changelist") + "?" + query
