"""The admin's overview page: what it shows, its chart, its admin.

What the admin's overview page shows, read with bounded, indexed queries.

Every read is a bounded range of an existing index, never a scan of a whole table:

- the due, parked and failed rows, the dead letters and workflows per status: counts exact
  up to :data:`COUNT_CAP`, estimated beyond (:mod:`django_outbox.admin.counts`), on the
  ``status, available_at``, ``status, failed_at`` and ``status`` indexes; the oldest due
  row's due time (one index entry); the last sweep (the store's read, as ``outbox
  status`` and the health check read it);
- the charts: per hour of the last 24, the published rows kept by ``outbox_keep_published``
  by the hour they became due (``status, available_at``), and the dead letters by the hour
  they failed (``status, failed_at``, one range per status, summed), estimated above a
  sample per hour;
- the groups: the newest :data:`GROUPED_LETTERS` ``dead`` letters (``status, failed_at``)
  grouped by task and exception type, so counts and first-seen times are those of that
  window when there are more dead letters;
- the parked retries due next: the first :data:`PARKED_SHOWN` rows of
  ``status = pending, available_at > now``.

There is no durable per-hour count of publishes: with ``outbox_keep_published = 0`` (the
default) a published row is deleted at once and the chart shows no publishes
(:attr:`OverviewData.keeps_published` says so).

Bar charts of counts per hour, drawn by the server as inline SVG.

No script, no external asset, no style sheet: each bar carries a ``<title>`` (its hour and
count, shown as a tooltip and read by screen readers), the axes carry labels, and the
chart a ``<title>`` and ``<desc>``. Every text is escaped (``format_html``).

The admin's overview page, ``/admin/django_outbox/overview/``: is the outbox healthy?

Open to staff users who may view dead letters or outbox messages. It shows the backlog
(pending, due, parked, failed, the oldest due row's wait), the last sweep, a chart of
publishes and dead letters per hour over the last 24 hours (:mod:`django_outbox.admin.overview`),
the dead letters grouped by task and exception type, the parked rows due next and the
workflows per status, every figure read by :func:`django_outbox.admin.overview.read_overview`.

Each group has Requeue and Discard buttons, shown only to users holding
``django_outbox.requeue_deadletter`` / ``discard_deadletter`` (and the view permission of
dead letters). A button POSTs (with the CSRF token) to a confirmation page saying what
will be done; only its own POST, with ``confirmed``, acts
(:mod:`django_outbox.admin.actions`). A POST from a user without the permission is
refused with 403, whatever it holds.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db import models
from django.db.models import Model, QuerySet
from django.db.models.functions import Left
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from celery_outbox.config import OutboxConfig
from celery_outbox.store.base import WORKFLOW_STATUSES, LastSweep
from celery_outbox.store.counts import Count
from celery_outbox.store.records import DeadLetterStatus, MessageStatus
from django_outbox.admin import actions as admin_actions
from django_outbox.admin import actions as letter_groups
from django_outbox.admin.counts import HOUR_SAMPLE, HourCount, bounded_counts, hourly_series
from django_outbox.admin.workflows import breakable
from django_outbox.celery_app import outbox_app
from django_outbox.models import DeadLetter, OutboxMessage, Overview, Workflow
from django_outbox.store import DjangoOutboxStore
from django_outbox.store.calls import database_now

# --- What the admin's overview page shows, read with bounded, indexed queries.

#: Rows a figure counts exactly at most (beyond: an estimate, said so).
COUNT_CAP = 10_000

#: Newest ``dead`` letters the groups are computed over.
GROUPED_LETTERS = 10_000

#: Groups shown at most (the largest first).
GROUPS_SHOWN = 25

#: Parked rows shown (the next due first).
PARKED_SHOWN = 10

#: Characters of a sample exception message loaded.
SAMPLE_CHARS = 200


@dataclass(frozen=True, kw_only=True)
class LetterGroup:
    """``dead`` letters of one task and exception type within the grouped window."""

    task_name: str
    exception_type: str
    count: int
    first_seen: datetime
    last_seen: datetime
    sample_id: int
    sample_message: str


@dataclass(frozen=True, kw_only=True)
class ParkedRow:
    """A pending row due later: when, and why it waits."""

    id: int
    task_name: str
    task_id: str
    due_at: datetime
    reason: str


@dataclass(frozen=True, kw_only=True)
class OverviewData:
    """Everything the overview page shows, read at ``now`` (the database's clock).

    ``pending`` is ``due`` plus ``parked``; ``oldest_due_at`` is when the oldest due row
    became due (``None`` without due rows).
    """

    now: datetime
    due: Count
    parked: Count
    failed: Count
    pending: Count
    oldest_due_at: datetime | None
    last_sweep: LastSweep | None
    letters: dict[str, Count]
    workflows: dict[str, Count]
    publishes: list[HourCount]
    dead_letters: list[HourCount]
    keeps_published: bool
    groups: list[LetterGroup]
    grouped_all: bool
    parked_rows: list[ParkedRow]

    @property
    def estimated(self) -> bool:
        """Whether a figure of the page is an estimate."""
        figures = [self.due, self.parked, self.failed, *self.letters.values()]
        return not all(f.exact for f in [*figures, *self.workflows.values()])


def read_overview(alias: str, *, keeps_published: bool) -> OverviewData:
    """The overview of database ``alias`` (see the module for each query)."""
    now = database_now(alias)
    messages = OutboxMessage.objects.using(alias)
    pending = messages.filter(status=MessageStatus.PENDING.value)
    letters = DeadLetter.objects.using(alias)
    workflows = Workflow.objects.using(alias)
    counts = bounded_counts(
        {
            "due": pending.filter(available_at__lte=now),
            "parked": pending.filter(available_at__gt=now),
            "failed": messages.filter(status=MessageStatus.FAILED.value),
            **{f"letters_{s.value}": letters.filter(status=s.value) for s in DeadLetterStatus},
            **{f"workflows_{s}": workflows.filter(status=s) for s in WORKFLOW_STATUSES},
        },
        COUNT_CAP,
    )
    series = {
        f"letters_{s.value}": (letters.filter(status=s.value), "failed_at")
        for s in DeadLetterStatus
    }
    if keeps_published:
        published = messages.filter(status=MessageStatus.PUBLISHED.value)
        series["published"] = (published, "available_at")
    hours = hourly_series(series, now)
    dead = counts["letters_dead"]
    oldest = pending.filter(available_at__lte=now).order_by("available_at")
    return OverviewData(
        now=now,
        due=counts["due"],
        parked=counts["parked"],
        failed=counts["failed"],
        pending=total(counts["due"], counts["parked"]),
        oldest_due_at=oldest.values_list("available_at", flat=True).first(),
        last_sweep=DjangoOutboxStore().last_sweep(using=alias),
        letters={s.value: counts[f"letters_{s.value}"] for s in DeadLetterStatus},
        workflows={s: counts[f"workflows_{s}"] for s in WORKFLOW_STATUSES},
        publishes=hours.get("published", []),
        dead_letters=summed_hours([hours[f"letters_{s.value}"] for s in DeadLetterStatus]),
        keeps_published=keeps_published,
        groups=dead_letter_groups(letters.filter(status=DeadLetterStatus.DEAD.value)),
        grouped_all=dead.exact and dead.value <= GROUPED_LETTERS,
        parked_rows=parked_next(messages, now),
    )


def summed_hours(series: list[list[HourCount]]) -> list[HourCount]:
    """The hour-by-hour sums of ``series`` (each over the same hours)."""
    return [
        HourCount(start=hours[0].start, count=functools.reduce(total, [h.count for h in hours]))
        for hours in zip(*series, strict=True)
    ]


def total(first: Count, second: Count) -> Count:
    """``first + second``, exact only when both are."""
    return Count(
        value=first.value + second.value,
        exact=first.exact and second.exact,
        lower_bound=first.lower_bound or second.lower_bound,
    )


def grouping_cutoff(dead: QuerySet[Any]) -> datetime | None:
    """``failed_at`` of the :data:`GROUPED_LETTERS`-th newest of ``dead``; ``None`` when
    there are no more than that.
    """
    newest = dead.order_by("-failed_at").values_list("failed_at", flat=True)
    found: list[datetime] = list(newest[GROUPED_LETTERS - 1 : GROUPED_LETTERS])
    return found[0] if found else None


def dead_letter_groups(dead: QuerySet[Any]) -> list[LetterGroup]:
    """The newest ``dead`` letters grouped by task and exception type, largest first."""
    cutoff = grouping_cutoff(dead)
    window = dead if cutoff is None else dead.filter(failed_at__gte=cutoff)
    rows = list(
        window.order_by()
        .values("task_name", "exception_type")
        .annotate(
            count=models.Count("id"),
            first=models.Min("failed_at"),
            last=models.Max("failed_at"),
            sample=models.Max("id"),
        )
        .order_by("-count", "task_name", "exception_type")[:GROUPS_SHOWN]
    )
    samples = dict(
        DeadLetter.objects.using(dead.db)
        .filter(id__in=[row["sample"] for row in rows])
        .annotate(head=Left("exception_message", SAMPLE_CHARS))
        .values_list("id", "head")
    )
    return [
        LetterGroup(
            task_name=row["task_name"],
            exception_type=row["exception_type"],
            count=row["count"],
            first_seen=row["first"],
            last_seen=row["last"],
            sample_id=row["sample"],
            sample_message=samples.get(row["sample"], ""),
        )
        for row in rows
    ]


def parked_next(rows: QuerySet[Any], now: datetime) -> list[ParkedRow]:
    """The first :data:`PARKED_SHOWN` pending rows due after ``now``, the next due first."""
    parked = (
        rows.filter(status=MessageStatus.PENDING.value, available_at__gt=now)
        .order_by("available_at", "id")
        .annotate(error_head=Left("last_error", SAMPLE_CHARS))
        .only("id", "task_name", "task_id", "available_at", "attempts", "options")
    )
    return [
        ParkedRow(
            id=row.id,
            task_name=row.task_name,
            task_id=row.task_id,
            due_at=row.available_at,
            reason=park_reason(row.attempts, row.error_head, row.options),
        )
        for row in parked[:PARKED_SHOWN]
    ]


def duration_text(age: timedelta | None) -> str:
    """``age`` for a person, to the second at most two units: ``42 s``, ``5 min 3 s``,
    ``2 h 4 min``, ``3 d 2 h`` (``-`` for ``None``).
    """
    if age is None:
        return "-"
    seconds = max(int(age.total_seconds()), 0)
    values: list[tuple[int, str]] = []
    for name, size in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        value, seconds = divmod(seconds, size)
        if value or values:
            values.append((value, name))
    return " ".join(f"{value} {name}" for value, name in values[:2] if value) or "0 s"


def park_reason(attempts: int, last_error: str, options: Any) -> str:
    """Why a pending row waits: a failed publish, a retry of a failed task, or a
    countdown or ETA given at dispatch.
    """
    if attempts > 0 and last_error:
        first_line = last_error.strip().splitlines()[0] if last_error.strip() else ""
        return f"publish failed {attempts} time(s): {first_line}"
    headers = (options or {}).get("headers") if isinstance(options, dict) else None
    retries = (headers or {}).get("retries") if isinstance(headers, dict) else None
    if isinstance(retries, int) and retries > 0:
        first = headers.get("outbox_first_failed_at") if isinstance(headers, dict) else None
        since = f", failing since {first}" if first else ""
        why = headers.get("outbox_retry_reason") if isinstance(headers, dict) else None
        cause = f" ({why})" if why else ""
        return f"retry {retries} of a failed task{cause}{since}"
    return "countdown or ETA given at dispatch"


# --- Bar charts of counts per hour, drawn by the server as inline SVG.

#: The drawing's size and its margins, in SVG units (pixels at 100 %).
WIDTH = 720
HEIGHT = 180

LEFT = 56
RIGHT = 8
TOP = 12
BOTTOM = 28

#: Hours between two labels of the time axis.
LABEL_EVERY = 3


def axis_top(largest: int) -> int:
    """The value at the top of the y axis: ``largest`` rounded up to 1, 2 or 5 times a
    power of ten (at least 1).
    """
    step = 1
    while True:
        for factor in (1, 2, 5):
            if step * factor >= largest:
                return step * factor
        step *= 10


def _hour(value: HourCount) -> str:
    return date_format(timezone.localtime(value.start), "H:i")


def bar_title(value: HourCount, noun: str) -> str:
    """The tooltip of one bar: ``13:00-14:00: 12 dead letters`` (``about 12,000 ...`` when
    estimated).
    """
    end = date_format(timezone.localtime(value.start + timedelta(hours=1)), "H:i")
    return f"{_hour(value)}-{end}: {value.count} {noun}"


def bar_chart(counts: Sequence[HourCount], *, title: str, noun: str, colour: str) -> SafeString:
    """An SVG bar chart of ``counts`` (one bar per hour, oldest first)."""
    top = axis_top(max((c.count.value for c in counts), default=0))
    plot_w = WIDTH - LEFT - RIGHT
    plot_h = HEIGHT - TOP - BOTTOM
    slot = plot_w / max(len(counts), 1)
    bars = []
    labels = []
    for index, value in enumerate(counts):
        height = plot_h * value.count.value / top
        x = LEFT + index * slot
        bars.append(
            (
                f"{x + 1:.1f}",
                f"{TOP + plot_h - height:.1f}",
                f"{max(slot - 2, 1):.1f}",
                f"{height:.1f}",
                colour,
                bar_title(value, noun),
            )
        )
        if index % LABEL_EVERY == 0:
            labels.append((f"{x + slot / 2:.1f}", f"{HEIGHT - 8}", _hour(value)))
    total = sum(c.count.value for c in counts)
    about = "" if all(c.count.exact for c in counts) else "about "
    desc = f"{about}{total:,} {noun} in the last {len(counts)} hours; the axis tops at {top:,}."
    return format_html(
        '<svg class="outbox-chart" xmlns="http://www.w3.org/2000/svg" role="img" '
        'viewBox="0 0 {w} {h}" width="{w}" height="{h}" font-family="sans-serif" '
        'font-size="11"><title>{title}</title><desc>{desc}</desc>'
        '<line x1="{left}" y1="{top_y}" x2="{left}" y2="{base}" stroke="#888"/>'
        '<line x1="{left}" y1="{base}" x2="{right}" y2="{base}" stroke="#888"/>'
        '<text x="{ylabel_x}" y="{top_label_y}" text-anchor="end">{top_value}</text>'
        '<text x="{ylabel_x}" y="{base}" text-anchor="end">0</text>'
        "{bars}{labels}</svg>",
        w=WIDTH,
        h=HEIGHT,
        title=title,
        desc=desc,
        left=LEFT,
        right=WIDTH - RIGHT,
        top_y=TOP,
        base=TOP + plot_h,
        ylabel_x=LEFT - 6,
        top_label_y=TOP + 8,
        top_value=f"{top:,}",
        bars=format_html_join(
            "",
            '<rect x="{}" y="{}" width="{}" height="{}" fill="{}"><title>{}</title></rect>',
            bars,
        ),
        labels=format_html_join("", '<text x="{}" y="{}" text-anchor="middle">{}</text>', labels),
    )


# --- The admin's overview page, ``/admin/django_outbox/overview/``: is the outbox healthy?

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
