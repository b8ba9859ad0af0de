"""What the admin's overview page shows, read with bounded, indexed queries.

Every read is a bounded range of an existing index, never a scan of a whole table:

- the due, parked and failed rows, the dead letters and workflows per status: counts exact
  up to :data:`COUNT_CAP`, estimated beyond (:mod:`django_outbox.bounded_counts`), on the
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
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import models
from django.db.models import QuerySet
from django.db.models.functions import Left

from celery_outbox.monitoring import LastSweep
from celery_outbox.records import DeadLetterStatus, MessageStatus
from celery_outbox.workflows import WORKFLOW_STATUSES
from django_outbox.bounded_counts import Count, HourCount, bounded_counts, hourly_series
from django_outbox.models import DeadLetter, OutboxMessage, Workflow
from django_outbox.store import DjangoOutboxStore
from django_outbox.store.clocks import database_now

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
        groups=letter_groups(letters.filter(status=DeadLetterStatus.DEAD.value)),
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
    there are no more than that."""
    newest = dead.order_by("-failed_at").values_list("failed_at", flat=True)
    found: list[datetime] = list(newest[GROUPED_LETTERS - 1 : GROUPED_LETTERS])
    return found[0] if found else None


def letter_groups(dead: QuerySet[Any]) -> list[LetterGroup]:
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
    ``2 h 4 min``, ``3 d 2 h`` (``-`` for ``None``)."""
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
    countdown or ETA given at dispatch."""
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
