"""Bounded counts in the Django store (:mod:`celery_outbox.estimates`): exact up to a
bound, PostgreSQL's planner estimate above it; other databases count exactly."""

from __future__ import annotations

from typing import Any

from django.db import connections
from django.db.models import QuerySet

from celery_outbox.estimates import explain_sql, plan_rows, settled


def bounded_count(rows: QuerySet[Any], bound: int | None, where: str) -> int:
    """How many ``rows``: exact up to ``bound``, above it the estimate of the rows of
    their table matching ``where`` (``bound`` ``None``: exact)."""
    if bound is None:
        return rows.count()
    return settled(
        rows.values("status")[: bound + 1].count(),  # in every index it counts along
        bound,
        lambda: estimate(rows.db, rows.model._meta.db_table, where),
    )


def bound_on(alias: str, bound: int | None) -> int | None:
    """``bound`` where the planner can estimate (PostgreSQL), else ``None``: exact."""
    return bound if connections[alias].vendor == "postgresql" else None


def estimate(alias: str, table: str, where: str) -> int:
    """PostgreSQL's estimate of the rows of ``table`` matching ``where``."""
    with connections[alias].cursor() as cursor:
        cursor.execute(explain_sql(connections[alias].ops.quote_name(table), where))
        return plan_rows(cursor.fetchone()[0])
