"""Bounded counts in the Django store (:mod:`celery_outbox.estimates`): exact up to a
bound, PostgreSQL's planner estimate above it; other databases count exactly.

The store's gauges and the admin's pages (:mod:`django_outbox.bounded_counts`) count
the same way: :func:`capped_counts` reads at most ``cap + 1`` index entries per count,
every count of one database in one statement, and :func:`planner_estimate` replaces a
count that reached the cap.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, TypeVar

from django.db import connections
from django.db.models import QuerySet, Value

from celery_outbox.estimates import plan_rows, settled

Key = TypeVar("Key", bound=Hashable)


def capped_counts(rows: Sequence[QuerySet[Any]], cap: int | None) -> list[int]:
    """How many of each of ``rows`` (querysets of one database), each read up to ``cap
    + 1`` (``None``: exactly), in one statement of scalar subqueries.

    Each subquery selects a constant, so PostgreSQL counts along an index alone (an
    index-only scan) wherever the filter's columns are indexed.
    """
    parts: list[str] = []
    params: list[Any] = []
    for index, queryset in enumerate(rows):
        counted = queryset.order_by().values(one=Value(1))
        if cap is not None:
            counted = counted[: cap + 1]
        sql, row_params = counted.query.sql_with_params()
        parts.append(f"(SELECT COUNT(*) FROM ({sql}) AS counted_{index})")
        params.extend(row_params)
    with connections[rows[0].db].cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(parts), params)
        return [int(n) for n in cursor.fetchone()]


def planner_estimate(rows: QuerySet[Any]) -> int | None:
    """PostgreSQL's estimate of how many ``rows`` there are (``EXPLAIN`` of their query:
    the statistics of the last ``ANALYZE``); ``None`` on other databases."""
    connection = connections[rows.db]
    if connection.vendor != "postgresql":
        return None
    sql, params = rows.order_by().values(one=Value(1)).query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql, params)
        return plan_rows(cursor.fetchone()[0])


def bounded_counts(
    named: Mapping[Key, QuerySet[Any]],
    bound: int | None,
    *,
    estimated_as: Mapping[Key, QuerySet[Any]] | None = None,
) -> dict[Key, int]:
    """How many rows each of ``named`` holds (one database): exact up to ``bound``, above
    it PostgreSQL's estimate, never below ``bound + 1`` (``bound`` ``None``: exact).

    ``estimated_as`` names, per count, other rows whose estimate to report: the same
    rows said in a way the planner estimates better (it takes the columns of a filter
    for independent).
    """
    keys = list(named)
    counted = capped_counts([named[key] for key in keys], bound)
    instead = estimated_as or {}
    return {
        key: settled(n, bound, _estimate(instead.get(key, named[key])))
        for key, n in zip(keys, counted, strict=True)
    }


def _estimate(rows: QuerySet[Any]) -> Callable[[], int]:
    return lambda: planner_estimate(rows) or 0


def bound_on(alias: str, bound: int | None) -> int | None:
    """``bound`` where the planner can estimate (PostgreSQL), else ``None``: exact."""
    return bound if connections[alias].vendor == "postgresql" else None
