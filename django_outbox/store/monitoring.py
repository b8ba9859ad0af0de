"""The backlog, the sweep record and bounded counts in the Django store.

Bounded counts in the Django store (:mod:`celery_outbox.store.counts`): exact up to a
bound, PostgreSQL's planner estimate above it; other databases count exactly.

The store's gauges and the admin's pages (:mod:`django_outbox.admin.counts`) count
the same way: :func:`capped_counts` reads at most ``cap + 1`` index entries per count,
every count of one database in one statement, and :func:`planner_estimate` replaces a
count that reached the cap.

The backlog and the sweep record in the Django store, on the database's clock.

The clock is ``statement_timestamp()`` on PostgreSQL and ``UTC_TIMESTAMP(6)`` on
MySQL/MariaDB (one ``SELECT``); on SQLite and other databases, this process's clock.
The sweep record is read first and written only when it is older than asked: a
compare-and-set ``UPDATE`` on the value read (an ``INSERT`` in a savepoint for the
first record, losing quietly to a concurrent one), so a skipped record writes and locks
nothing and concurrent sweepers never fail.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from datetime import datetime, timedelta
from functools import partial
from typing import Any, TypeVar

from django.db import IntegrityError, connections, transaction
from django.db.models import Case, Count, F, Min, QuerySet, Value, When

from celery_outbox.store.base import SWEEP_NAME, Backlog, LastSweep, OutboxStore
from celery_outbox.store.counts import bounded, plan_rows
from celery_outbox.store.records import OUTBOX_TABLE, DeadLetterStatus, MessageStatus
from django_outbox.models import DeadLetter, SweepRecord
from django_outbox.store.calls import (
    alias_of,
    clock_of,
    database_now,
    refresh_connection,
    store_errors,
)
from django_outbox.store.vendors import messages

# --- Bounded counts in the Django store (:mod:`celery_outbox.store.counts`): exact up to a

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
    the statistics of the last ``ANALYZE``); ``None`` on other databases.
    """
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
        key: bounded(n, bound, partial(planner_estimate, instead.get(key, named[key]))).least
        for key, n in zip(keys, counted, strict=True)
    }


def _less(pending: QuerySet[Any], parked: int) -> int | None:
    """The estimate of the ``pending`` rows less the ``parked`` ones: the due rows'."""
    estimate = planner_estimate(pending)
    return None if estimate is None else estimate - parked


def bound_on(alias: str, bound: int | None) -> int | None:
    """``bound`` where the planner can estimate (PostgreSQL), else ``None``: exact."""
    return bound if connections[alias].vendor == "postgresql" else None


# --- The backlog and the sweep record in the Django store, on the database's clock.

#: When a due row started waiting: its due time, or its creation once a publish failed.
_WAITING_SINCE = Case(When(attempts__gt=0, then=F("created_at")), default=F("available_at"))

FAILED = MessageStatus.FAILED.value

#: The due rows' count and longest wait, of the ``%s`` rows due longest (PostgreSQL).
_BOUNDED_DUE = f"""
    SELECT count(*), min(since) FROM (
        SELECT CASE WHEN attempts > 0 THEN created_at ELSE available_at END AS since
        FROM {OUTBOX_TABLE} WHERE status = %s AND available_at <= %s
        ORDER BY available_at LIMIT %s
    ) AS due
"""


def _failed(alias: str) -> Any:
    return messages(alias).filter(status=FAILED)


def _due(alias: str, now: datetime, bound: int | None) -> dict[str, Any]:
    """The due rows' ``count`` and the start of the longest wait, ``since`` (``None``
    without due rows); with a ``bound``, of the ``bound + 1`` rows due longest, read
    along the due-row index.
    """
    if bound is None:
        due = messages(alias).pending().filter(available_at__lte=now)
        found: dict[str, Any] = due.aggregate(count=Count("id"), since=Min(_WAITING_SINCE))
        return found
    with connections[alias].cursor() as cursor:
        cursor.execute(_BOUNDED_DUE, [MessageStatus.PENDING.value, now, bound + 1])
        count, since = cursor.fetchone()
    return {"count": count, "since": since}


class DjangoMonitoring(OutboxStore):
    """The monitoring half of :class:`~django_outbox.store.DjangoOutboxStore`."""

    def now(self, *, using: str | None = None) -> datetime:
        """The clock of database ``using`` (:mod:`django_outbox.store.calls`)."""
        alias = alias_of(using)
        with store_errors("read the database's clock"):
            return clock_of(alias)()

    def backlog(self, *, using: str | None = None, bound: int | None = None) -> Backlog:
        """Two short reads after the clock: the parked and the failed rows' counts, then
        the due rows' (a count above ``bound`` is PostgreSQL's estimate:
        :mod:`celery_outbox.store.counts`; the due rows' is the pending rows' less the parked,
        since the planner takes status and due time for independent).
        """
        alias = alias_of(using)
        refresh_connection(alias)
        bound = bound_on(alias, bound)
        with store_errors("read the outbox backlog"):
            now = database_now(alias)
            pending = messages(alias).pending()
            later = messages(alias).filter(available_at__gt=now)  # pending, in practice
            counts = bounded_counts(
                {"parked": pending.filter(available_at__gt=now), "failed": _failed(alias)},
                bound,
                estimated_as={"parked": later},
            )
            parked = counts["parked"]
            failed = counts["failed"]
            due = _due(alias, now, bound)
            estimate = partial(_less, pending, parked)
            count = bounded(due["count"], bound, estimate).least
        since: datetime | None = due["since"]
        return Backlog(
            due=count,
            parked=parked,
            failed=failed,
            oldest_due_age=None if since is None else now - since,
        )

    def count_dead_letters(
        self, *, using: str | None = None, bound: int | None = None
    ) -> Mapping[DeadLetterStatus, int]:
        """One statement of a count per status, each a range of the ``status, failed_at``
        index (a ``GROUP BY`` over the whole table is planned as a sequential scan).
        """
        alias = alias_of(using)
        refresh_connection(alias)
        bound = bound_on(alias, bound)
        letters = DeadLetter.objects.using(alias)
        with store_errors("count the dead letters"):
            return bounded_counts(
                {s: letters.filter(status=s.value) for s in DeadLetterStatus}, bound
            )

    def keeps_sweeps(self) -> bool:
        """Always: the ``celery_outbox_sweep`` table records the last sweep."""
        return True

    def record_sweep(self, *, every: timedelta, using: str | None = None) -> bool:
        """Read the record, then write it when it is older than ``every`` (see the module)."""
        alias = alias_of(using)
        refresh_connection(alias)
        records = SweepRecord.objects.using(alias)
        with store_errors("record the sweep"):
            now = database_now(alias)
            last = _last_sweep_at(alias)
            if last is not None and now - last < every:
                return False
            if last is not None:
                swap = records.filter(name=SWEEP_NAME, last_sweep_at=last)
                return bool(swap.update(last_sweep_at=now))
            try:
                with transaction.atomic(using=alias):
                    records.create(name=SWEEP_NAME, last_sweep_at=now)
            except IntegrityError:  # another sweeper recorded the first sweep meanwhile
                return False
            return True

    def last_sweep(self, *, using: str | None = None) -> LastSweep | None:
        """The record and the database's clock: two short reads."""
        alias = alias_of(using)
        refresh_connection(alias)
        with store_errors("read the last sweep"):
            last = _last_sweep_at(alias)
            if last is None:
                return None
            return LastSweep(at=last, age=max(database_now(alias) - last, timedelta(0)))


def _last_sweep_at(alias: str) -> datetime | None:
    found: datetime | None = (
        SweepRecord.objects.using(alias)
        .filter(name=SWEEP_NAME)
        .values_list("last_sweep_at", flat=True)
        .first()
    )
    return found
