"""Counts that stay cheap on large tables: exact up to a cap, estimated beyond it.

:func:`bounded_count` reads at most ``cap + 1`` entries of an index range; beyond the cap
it gives PostgreSQL's planner estimate of the range (``EXPLAIN``, from the statistics
``ANALYZE`` keeps), or, on other databases, the cap itself marked as a lower bound: the one
policy of :mod:`celery_outbox.store.counts`.
:func:`hourly_counts` counts the rows of each hour of the last day in one statement: per
hour the rows up to :data:`HOUR_SAMPLE`, and the time of the :data:`HOUR_SAMPLE`-th row;
an hour holding more is estimated from how long its first :data:`HOUR_SAMPLE` rows took.
An estimate is always marked (``exact`` is false) and the page says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from functools import partial
from typing import Any

from django.db import connections
from django.db.models import QuerySet

from celery_outbox.store.counts import Count, bounded
from django_outbox.store.monitoring import capped_counts, planner_estimate

#: Rows read per hour of a chart at most.
HOUR_SAMPLE = 1000
#: Hours a chart covers (the current, partial hour last).
HOURS = 24


@dataclass(frozen=True, kw_only=True)
class HourCount:
    """One bar of a chart: the rows in ``[start, start + 1 h)``."""

    start: datetime
    count: Count


def bounded_count(rows: QuerySet[Any], cap: int) -> Count:
    """The number of ``rows``: exact up to ``cap``, estimated (or a lower bound) beyond."""
    return bounded_counts({"rows": rows}, cap)["rows"]


def bounded_counts(named: dict[str, QuerySet[Any]], cap: int) -> dict[str, Count]:
    """:func:`bounded_count` of each of ``named`` (querysets of one database): one statement
    of capped counts, then one ``EXPLAIN`` per count beyond ``cap``
    (:mod:`django_outbox.store.monitoring`, which the store's gauges count with too).
    """
    found = capped_counts(list(named.values()), cap)
    return {
        name: bounded(value, cap, partial(planner_estimate, rows))
        for (name, rows), value in zip(named.items(), found, strict=True)
    }


def hour_starts(now: datetime, hours: int = HOURS) -> list[datetime]:
    """The starts of the last ``hours`` whole hours, the one holding ``now`` last."""
    current = now.replace(minute=0, second=0, microsecond=0)
    return [current - timedelta(hours=back) for back in range(hours - 1, -1, -1)]


def hourly_counts(rows: QuerySet[Any], field: str, now: datetime) -> list[HourCount]:
    """``rows`` per hour of ``field`` over the last :data:`HOURS` (see the module)."""
    return hourly_series({"rows": (rows, field)}, now)["rows"]


def hourly_series(
    named: dict[str, tuple[QuerySet[Any], str]], now: datetime
) -> dict[str, list[HourCount]]:
    """:func:`hourly_counts` of each of ``named`` (``(rows, field)`` of one database) in
    one statement, reading at most 2 x :data:`HOUR_SAMPLE` entries of an index on
    ``field`` per hour and series. Each series' SQL is built once, for every hour.
    """
    starts = hour_starts(now)
    parts: list[str] = []
    params: list[Any] = []
    alias = next(iter(named.values()))[0].db
    adapt = connections[alias].ops.adapt_datetimefield_value
    for index, (rows, field) in enumerate(named.values()):
        for sql, template in _hour_statements(rows, field, f"s{index}"):
            for start in starts:
                bounds = {adapt(_FROM): adapt(start), adapt(_TO): adapt(start + timedelta(hours=1))}
                parts.append(sql)
                params.extend(bounds.get(value, value) for value in template)
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(parts), params)
        found = cursor.fetchone()
    result = {}
    hours = len(starts)
    for index, name in enumerate(named):
        counted = found[2 * hours * index : 2 * hours * index + hours]
        ends = found[2 * hours * index + hours : 2 * hours * (index + 1)]
        result[name] = [
            HourCount(start=start, count=hour_count(start, n, end, now))
            for start, n, end in zip(starts, counted, ends, strict=True)
        ]
    return result


#: Stand-ins for an hour's bounds while a series' SQL is built (replaced per hour).
_FROM = datetime(1971, 1, 1, tzinfo=timezone.utc)
_TO = datetime(1972, 1, 1, tzinfo=timezone.utc)


def _hour_statements(rows: QuerySet[Any], field: str, name: str) -> list[tuple[str, list[Any]]]:
    """The capped count and the sample's last time of one hour of ``rows``, as scalar
    subqueries with :data:`_FROM` and :data:`_TO` among their parameters.
    """
    hour = rows.filter(**{f"{field}__gte": _FROM, f"{field}__lt": _TO})
    sql, capped = hour.order_by().values("pk")[:HOUR_SAMPLE].query.sql_with_params()
    last = hour.order_by(field).values(field)[HOUR_SAMPLE - 1 : HOUR_SAMPLE]
    last_sql, last_params = last.query.sql_with_params()
    return [
        (f"(SELECT COUNT(*) FROM ({sql}) AS {name})", list(capped)),
        (f"({last_sql})", list(last_params)),
    ]


def hour_count(start: datetime, counted: int, sample_end: Any, now: datetime) -> Count:
    """The count of the hour starting at ``start``: ``counted`` when it is below the
    sample, else estimated from ``sample_end``, when the sample's last row falls.
    """
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
