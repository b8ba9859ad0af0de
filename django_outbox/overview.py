"""What the admin's overview page shows, read with bounded, indexed queries.

Every read is a range of an existing index, never a scan of a whole table:

- the backlog, the last sweep, the dead letters and workflows per status: the store's
  monitoring reads (:class:`~django_outbox.store.DjangoOutboxStore`, as ``outbox status``,
  the health check and the metrics read them);
- the chart: per hour of the last 24, the published rows kept by ``outbox_keep_published``
  by the hour they became due (``status, available_at``), and the dead letters by the hour
  they failed (``status, failed_at``), each count cut at :data:`HOURLY_CAP`;
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

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connections
from django.db.models import Count, Max, Min, QuerySet
from django.db.models.functions import Left

from celery_outbox.monitoring import Backlog, LastSweep
from celery_outbox.records import DeadLetterStatus, MessageStatus
from django_outbox.models import DeadLetter, OutboxMessage
from django_outbox.store import DjangoOutboxStore
from django_outbox.store.monitoring import database_now

#: Hours the chart covers (the current, partial hour last).
HOURS = 24
#: Rows counted per hour and series at most (a bar above it is drawn at the cap).
HOURLY_CAP = 20_000
#: Newest ``dead`` letters the groups are computed over.
GROUPED_LETTERS = 10_000
#: Groups shown at most (the largest first).
GROUPS_SHOWN = 25
#: Parked rows shown (the next due first).
PARKED_SHOWN = 10
#: Characters of a sample exception message loaded.
SAMPLE_CHARS = 200


@dataclass(frozen=True, kw_only=True)
class HourCount:
    """One bar of the chart: rows in ``[start, start + 1 h)``; ``capped``: there were more
    than :data:`HOURLY_CAP` and ``count`` is the cap."""

    start: datetime
    count: int
    capped: bool = False


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
    """Everything the overview page shows, read at ``now`` (the database's clock)."""

    now: datetime
    backlog: Backlog
    last_sweep: LastSweep | None
    letters: dict[str, int]
    workflows: dict[str, int]
    publishes: list[HourCount]
    dead_letters: list[HourCount]
    keeps_published: bool
    groups: list[LetterGroup]
    grouped_all: bool
    parked: list[ParkedRow]


def read_overview(alias: str, *, keeps_published: bool) -> OverviewData:
    """The overview of database ``alias`` (see the module for each query)."""
    store = DjangoOutboxStore()
    now = database_now(alias)
    letters = {s.value: n for s, n in store.count_dead_letters(using=alias).items()}
    dead = DeadLetter.objects.using(alias).dead()
    published = OutboxMessage.objects.using(alias).filter(status=MessageStatus.PUBLISHED.value)
    failed = DeadLetter.objects.using(alias).filter(status__in=[s.value for s in DeadLetterStatus])
    return OverviewData(
        now=now,
        backlog=store.backlog(using=alias),
        last_sweep=store.last_sweep(using=alias),
        letters=letters,
        workflows={str(s): n for s, n in store.count_workflows(using=alias).items()},
        publishes=hourly_counts(published, "available_at", now) if keeps_published else [],
        dead_letters=hourly_counts(failed, "failed_at", now),
        keeps_published=keeps_published,
        groups=letter_groups(dead),
        grouped_all=letters[DeadLetterStatus.DEAD.value] <= GROUPED_LETTERS,
        parked=parked_next(OutboxMessage.objects.using(alias), now),
    )


def hour_starts(now: datetime, hours: int = HOURS) -> list[datetime]:
    """The starts of the last ``hours`` whole hours, the one holding ``now`` last."""
    current = now.replace(minute=0, second=0, microsecond=0)
    return [current - timedelta(hours=back) for back in range(hours - 1, -1, -1)]


def hourly_counts(rows: QuerySet[Any], field: str, now: datetime) -> list[HourCount]:
    """Rows of ``rows`` per hour of ``field``: one statement of one capped count (a range
    of an index on ``status, field``) per hour, as scalar subqueries."""
    starts = hour_starts(now)
    parts, params = [], []
    for index, start in enumerate(starts):
        window = rows.filter(**{f"{field}__gte": start, f"{field}__lt": start + timedelta(hours=1)})
        sql, window_params = (
            window.order_by().values("pk")[: HOURLY_CAP + 1].query.sql_with_params()
        )
        parts.append(f"(SELECT COUNT(*) FROM ({sql}) AS hour_{index})")
        params.extend(window_params)
    with connections[rows.db].cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(parts), params)
        found = cursor.fetchone()
    return [
        HourCount(start=start, count=min(n, HOURLY_CAP), capped=n > HOURLY_CAP)
        for start, n in zip(starts, found, strict=True)
    ]


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
            count=Count("id"), first=Min("failed_at"), last=Max("failed_at"), sample=Max("id")
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
        return f"retry {retries} of a failed task{since}"
    return "countdown or ETA given at dispatch"
