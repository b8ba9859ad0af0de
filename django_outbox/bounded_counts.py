"""Counts that stay cheap on large tables: exact up to a cap, estimated beyond it.

:func:`bounded_count` reads at most ``cap + 1`` entries of an index range; beyond the cap
it gives PostgreSQL's planner estimate of the range (``EXPLAIN``, from the statistics
``ANALYZE`` keeps), or, on other databases, the cap itself marked as a lower bound.
:func:`hourly_counts` counts the rows of each hour of the last day in one statement: per
hour the rows up to :data:`HOUR_SAMPLE`, and the time of the :data:`HOUR_SAMPLE`-th row;
an hour holding more is estimated from how long its first :data:`HOUR_SAMPLE` rows took.
An estimate is always marked (``exact`` is false) and the page says so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connections
from django.db.models import QuerySet

#: Rows read per hour of a chart at most.
HOUR_SAMPLE = 1000
#: Hours a chart covers (the current, partial hour last).
HOURS = 24


@dataclass(frozen=True, kw_only=True)
class Count:
    """A number of rows: ``exact``, an estimate, or (``lower_bound``) more than ``value``."""

    value: int
    exact: bool = True
    lower_bound: bool = False

    def __str__(self) -> str:
        if self.exact:
            return f"{self.value:,}"
        return f"more than {self.value:,}" if self.lower_bound else f"about {self.value:,}"


@dataclass(frozen=True, kw_only=True)
class HourCount:
    """One bar of a chart: the rows in ``[start, start + 1 h)``."""

    start: datetime
    count: Count


def bounded_count(rows: QuerySet[Any], cap: int) -> Count:
    """The number of ``rows``: exact up to ``cap``, estimated (or a lower bound) beyond."""
    found = rows.order_by()[: cap + 1].count()
    if found <= cap:
        return Count(value=found)
    estimate = planner_estimate(rows)
    if estimate is None or estimate <= cap:
        return Count(value=cap, exact=False, lower_bound=True)
    return Count(value=estimate, exact=False)


def planner_estimate(rows: QuerySet[Any]) -> int | None:
    """PostgreSQL's estimate of how many ``rows`` there are; ``None`` elsewhere."""
    connection = connections[rows.db]
    if connection.vendor != "postgresql":
        return None
    sql, params = rows.order_by().values("pk").query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql, params)
        plan = cursor.fetchone()[0]
    document = json.loads(plan) if isinstance(plan, str) else plan
    return int(document[0]["Plan"]["Plan Rows"])


def hour_starts(now: datetime, hours: int = HOURS) -> list[datetime]:
    """The starts of the last ``hours`` whole hours, the one holding ``now`` last."""
    current = now.replace(minute=0, second=0, microsecond=0)
    return [current - timedelta(hours=back) for back in range(hours - 1, -1, -1)]


def hourly_counts(rows: QuerySet[Any], field: str, now: datetime) -> list[HourCount]:
    """``rows`` per hour of ``field`` over the last :data:`HOURS` (see the module), one
    statement reading at most 2 x :data:`HOUR_SAMPLE` entries of an index on ``field``
    per hour."""
    starts = hour_starts(now)
    parts: list[str] = []
    params: list[Any] = []
    for index, start in enumerate(starts):
        hour = rows.filter(**{f"{field}__gte": start, f"{field}__lt": start + timedelta(hours=1)})
        capped = hour.order_by().values("pk")[:HOUR_SAMPLE]
        sql, capped_params = capped.query.sql_with_params()
        last = hour.order_by(field).values(field)[HOUR_SAMPLE - 1 : HOUR_SAMPLE]
        last_sql, last_params = last.query.sql_with_params()
        parts.append(f"(SELECT COUNT(*) FROM ({sql}) AS hour_{index})")
        parts.append(f"({last_sql})")
        params.extend([*capped_params, *last_params])
    with connections[rows.db].cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(parts), params)
        found = cursor.fetchone()
    return [
        HourCount(start=start, count=hour_count(start, found[2 * i], found[2 * i + 1], now))
        for i, start in enumerate(starts)
    ]


def hour_count(start: datetime, counted: int, sample_end: Any, now: datetime) -> Count:
    """The count of the hour starting at ``start``: ``counted`` when it is below the
    sample, else estimated from ``sample_end``, when the sample's last row falls."""
    if counted < HOUR_SAMPLE or sample_end is None:
        return Count(value=counted)
    end = sample_end if isinstance(sample_end, datetime) else None
    if end is None:  # SQLite returns text: parse it the way Django stores it
        end = datetime.fromisoformat(str(sample_end))
    if end.tzinfo is None:
        end = end.replace(tzinfo=start.tzinfo)
    span = (end - start).total_seconds()
    covered = (min(now, start + timedelta(hours=1)) - start).total_seconds()
    if span <= 0:
        return Count(value=HOUR_SAMPLE, exact=False, lower_bound=True)
    return Count(value=max(HOUR_SAMPLE, round(HOUR_SAMPLE * covered / span)), exact=False)
