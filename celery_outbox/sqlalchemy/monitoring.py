"""The backlog, the sweep record and bounded counts on SQLAlchemy.

Bounded counts in the SQLAlchemy store (:mod:`celery_outbox.store.counts`): exact up to
a bound, PostgreSQL's planner estimate above it; other databases count exactly.

The backlog and the sweep record on SQLAlchemy, on the database's clock.

The clock is ``now()`` on PostgreSQL and ``UTC_TIMESTAMP(6)`` on MySQL/MariaDB; SQLite
is a file on one host, so the store's clock is the database's. :meth:`~SQLAlchemyMonitoring.now`
gives the same clock to the rest of the store and to the core. The sweep record is
read first and written only when it is older than asked, with a compare-and-set
``UPDATE`` (or an insert that ignores a conflict for the first one): a skipped record
writes and locks nothing, and concurrent sweepers never fail.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Table,
    bindparam,
    case,
    func,
    insert,
    literal,
    literal_column,
    select,
    type_coerce,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite

from celery_outbox.clock import DatabaseClock
from celery_outbox.sqlalchemy import statements as sql
from celery_outbox.sqlalchemy.tables import OutboxTables
from celery_outbox.sqlalchemy.types import UTCDateTime, store_errors
from celery_outbox.store.base import SWEEP_NAME, Backlog, LastSweep, OutboxStore
from celery_outbox.store.counts import DUE_LATER, bounded, explain_sql, plan_rows, status_is
from celery_outbox.store.records import DeadLetterStatus, MessageStatus

# --- Bounded counts in the SQLAlchemy store (:mod:`celery_outbox.store.counts`): exact up to


def bound_on(conn: Connection, bound: int | None) -> int | None:
    """``bound`` where the planner can estimate (PostgreSQL), else ``None``: exact."""
    return bound if conn.dialect.name == "postgresql" else None


def bounded_count(
    conn: Connection, table: Table, bound: int | None, where: str, *clauses: ColumnElement[bool]
) -> int:
    """How many rows of ``table`` match ``clauses``: exact up to ``bound``, above it the
    estimate of the rows matching ``where`` (its SQL text); ``bound`` ``None``: exact.
    """
    if bound is None:
        return int(conn.execute(select(func.count()).select_from(table).where(*clauses)).one()[0])
    first: Any = select(literal_column("1")).select_from(table).where(*clauses).limit(bound + 1)
    counted = conn.execute(select(func.count()).select_from(first.subquery())).one()[0]
    return bounded(int(counted), bound, lambda: estimate(conn, table, where)).least


def estimate(conn: Connection, table: Table, where: str) -> int:
    """PostgreSQL's estimate of the rows of ``table`` matching ``where``."""
    name = conn.dialect.identifier_preparer.format_table(table)
    explained: Any = conn.exec_driver_sql(explain_sql(name, where)).one()[0]
    return plan_rows(explained)


# --- The backlog and the sweep record on SQLAlchemy, on the database's clock.

PENDING = MessageStatus.PENDING.value

#: The dialects whose server has a clock of its own to read.
_CLOCKED_DIALECTS = frozenset({"postgresql", "mysql", "mariadb"})

FAILED = MessageStatus.FAILED.value

_PENDING = status_is(PENDING)
_FAILED = status_is(FAILED)


class SQLAlchemyMonitoring(OutboxStore):
    """The monitoring reads and the sweep record of
    :class:`~celery_outbox.sqlalchemy.SQLAlchemyOutboxStore`.
    """

    engine: Engine
    tables: OutboxTables
    clock: Callable[[], datetime]

    def now(self, *, using: str | None = None) -> datetime:
        """The database's clock (:mod:`celery_outbox.clock`); on SQLite, a file
        on this host with no clock of its own, the store's ``clock``.
        """
        if self.engine.dialect.name not in _CLOCKED_DIALECTS:
            return self.clock()
        return self._database_clock()

    def now_reads(self) -> bool:
        """Whether :meth:`now` may make a round trip soon (its reading runs out within a
        second): an async dispatch reads it off the event loop first.
        """
        clocked = self.engine.dialect.name in _CLOCKED_DIALECTS
        return clocked and not self._database_clock.serves(1.0)

    @functools.cached_property
    def _database_clock(self) -> DatabaseClock:
        return DatabaseClock(self._read_clock)

    def _read_clock(self) -> datetime:
        with store_errors("read the database's clock"), self.engine.connect() as conn:
            now: datetime = conn.execute(select(self._now(conn))).scalar_one()
        return now

    def backlog(self, *, using: str | None = None, bound: int | None = None) -> Backlog:
        table = self.tables.outbox
        with store_errors("read the outbox backlog"), self.engine.connect() as conn:
            bound = bound_on(conn, bound)
            now_expr = self._now(conn)
            if bound is None:
                later = _count(table, table.c.status == PENDING, table.c.available_at > now_expr)
                gave_up = _count(table, table.c.status == FAILED)
                now, parked, failed = conn.execute(select(now_expr, later, gave_up)).one()
            else:
                now = conn.execute(select(now_expr)).one()[0]
                c = table.c
                later_now = (c.status == PENDING, c.available_at > now)
                parked = bounded_count(conn, table, bound, DUE_LATER, *later_now)
                failed = bounded_count(conn, table, bound, _FAILED, c.status == FAILED)
            due, since = conn.execute(_due_query(table, bound), {"now": now}).one()
            if bound is not None:
                due = bounded(due, bound, lambda: estimate(conn, table, _PENDING) - parked).least
        return Backlog(
            due=int(due),
            parked=int(parked),
            failed=int(failed),
            oldest_due_age=None if since is None else now - since,
        )

    def count_by_status(self, *, using: str | None = None) -> Mapping[MessageStatus, int]:
        with store_errors("count outbox rows"), self.engine.connect() as conn:
            return sql.count_by_status(conn, self.tables.outbox)

    def oldest_pending(self, *, using: str | None = None) -> datetime | None:
        with store_errors("read the oldest pending row"), self.engine.connect() as conn:
            return sql.oldest_pending(conn, self.tables.outbox)

    def count_dead_letters(
        self, *, using: str | None = None, bound: int | None = None
    ) -> Mapping[DeadLetterStatus, int]:
        # One count per status, each a range of the (status, failed_at) index: a GROUP BY
        # over the whole table is planned as a sequential scan.
        table = self.tables.dead_letter
        statuses = list(DeadLetterStatus)
        with store_errors("count the dead letters"), self.engine.connect() as conn:
            bound = bound_on(conn, bound)
            if bound is None:
                query = select(*(_count(table, table.c.status == s.value) for s in statuses))
                counts = list(conn.execute(query).one())
            else:
                counts = [
                    bounded_count(conn, table, bound, status_is(s.value), table.c.status == s.value)
                    for s in statuses
                ]
        return {status: int(n) for status, n in zip(statuses, counts, strict=True)}

    def keeps_sweeps(self) -> bool:
        """``True``: the ``celery_outbox_sweep`` table records the last sweep."""
        return True

    def record_sweep(self, *, every: timedelta, using: str | None = None) -> bool:
        table = self.tables.sweep
        with store_errors("record the sweep"), self.engine.begin() as conn:
            now, last = self._read_sweep(conn)
            if last is not None and now - last < every:
                return False
            if last is None:
                return _insert_absent(conn, table, now)
            swap = (
                update(table)
                .where(table.c.name == SWEEP_NAME, table.c.last_sweep_at == last)
                .values(last_sweep_at=now)
            )
            return bool(conn.execute(swap).rowcount)

    def last_sweep(self, *, using: str | None = None) -> LastSweep | None:
        with store_errors("read the last sweep"), self.engine.connect() as conn:
            now, last = self._read_sweep(conn)
        return None if last is None else LastSweep(at=last, age=max(now - last, timedelta(0)))

    def _read_sweep(self, conn: Connection) -> tuple[datetime, datetime | None]:
        c = self.tables.sweep.c
        last = select(c.last_sweep_at).where(c.name == SWEEP_NAME).scalar_subquery()
        now, at = conn.execute(select(self._now(conn), last)).one()
        return now, at

    def _now(self, conn: Connection) -> ColumnElement[datetime]:
        """The database's current time as a column (the store's clock on SQLite)."""
        dialect = conn.dialect.name
        if dialect == "postgresql":
            return type_coerce(func.now(), UTCDateTime())
        if dialect in ("mysql", "mariadb"):
            return type_coerce(func.utc_timestamp(literal_column("6")), UTCDateTime())
        return literal(self.clock(), UTCDateTime())


def _count(table: Table, *where: ColumnElement[bool]) -> Any:
    return select(func.count()).select_from(table).where(*where).scalar_subquery()


def _due_query(table: Table, bound: int | None) -> Any:
    """How many pending rows are due at ``:now``, and since when the longest-waiting one
    waits (its due time, or its creation once a publish failed); with a ``bound``, of the
    ``bound + 1`` rows due longest (along the due-row index).
    """
    c = table.c
    now = bindparam("now", type_=UTCDateTime())
    since = case((c.attempts > 0, c.created_at), else_=c.available_at)
    due = (c.status == PENDING, c.available_at <= now)
    if bound is None:
        return select(func.count(), type_coerce(func.min(since), UTCDateTime())).where(*due)
    first = select(since.label("since")).where(*due).order_by(c.available_at).limit(bound + 1)
    rows = first.subquery()
    return select(func.count(), type_coerce(func.min(rows.c.since), UTCDateTime()))


def _insert_absent(conn: Connection, table: Table, now: datetime) -> bool:
    """Write the first record of the sweep, doing nothing when another sweeper wrote it
    first; whether it wrote (``RETURNING``: the driver's row count of an ``INSERT ... ON
    CONFLICT DO NOTHING`` is not reliable; MySQL's ``INSERT IGNORE`` counts it right).
    """
    values = {"name": SWEEP_NAME, "last_sweep_at": now}
    dialect = conn.dialect.name
    if dialect in ("postgresql", "sqlite"):
        make = postgresql.insert if dialect == "postgresql" else sqlite.insert
        absent = make(table).values(values).on_conflict_do_nothing().returning(table.c.name)
        return conn.execute(absent).first() is not None
    return bool(conn.execute(insert(table).values(values).prefix_with("IGNORE")).rowcount)
