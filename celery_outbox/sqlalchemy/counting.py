"""Bounded counts in the SQLAlchemy store (:mod:`celery_outbox.estimates`): exact up to
a bound, PostgreSQL's planner estimate above it; other databases count exactly."""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, Connection, Table, func, literal_column, select

from celery_outbox.estimates import explain_sql, plan_rows, settled


def bound_on(conn: Connection, bound: int | None) -> int | None:
    """``bound`` where the planner can estimate (PostgreSQL), else ``None``: exact."""
    return bound if conn.dialect.name == "postgresql" else None


def bounded_count(
    conn: Connection, table: Table, bound: int | None, where: str, *clauses: ColumnElement[bool]
) -> int:
    """How many rows of ``table`` match ``clauses``: exact up to ``bound``, above it the
    estimate of the rows matching ``where`` (its SQL text); ``bound`` ``None``: exact."""
    if bound is None:
        return int(conn.execute(select(func.count()).select_from(table).where(*clauses)).one()[0])
    first: Any = select(literal_column("1")).select_from(table).where(*clauses).limit(bound + 1)
    counted = conn.execute(select(func.count()).select_from(first.subquery())).one()[0]
    return settled(int(counted), bound, lambda: estimate(conn, table, where))


def estimate(conn: Connection, table: Table, where: str) -> int:
    """PostgreSQL's estimate of the rows of ``table`` matching ``where``."""
    name = conn.dialect.identifier_preparer.format_table(table)
    explained: Any = conn.exec_driver_sql(explain_sql(name, where)).one()[0]
    return plan_rows(explained)
