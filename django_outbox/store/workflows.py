"""``Workflow`` rows and chord joins in the Django store (:mod:`celery_outbox.store.base`).

Every write goes through the ORM (or one raw statement) on the alias, so it joins
whatever ``transaction.atomic(using=...)`` block the caller is in, like ``add``:

- :meth:`DjangoWorkflows.add_workflow_steps` is one upsert
  (:func:`~django_outbox.store.statements.add_workflow_steps`); on a database without one, an
  ``UPDATE`` then an ``INSERT`` in a savepoint, and the ``UPDATE`` again when a
  concurrent transaction inserted the row first.
- :meth:`DjangoWorkflows.workflow_step_done` is one ``UPDATE``: the step count capped at
  ``steps_total``, the status and ``finished_at`` set by a ``CASE`` on the row's values.
- :meth:`DjangoWorkflows.join_part` reads the join row with ``SELECT ... FOR UPDATE``: a
  concurrent step waits, and the locking read sees the latest committed row even under
  MySQL/MariaDB's ``REPEATABLE READ`` (SQLite: an ``UPDATE`` takes the write lock first).

A join's ``results`` column holds its header parts as :mod:`celery_outbox.store.records`
writes them (the same in every store).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from django.db import IntegrityError, connections, transaction
from django.db.models import Case, DateTimeField, F, Q, QuerySet, Value, When
from django.db.models.functions import Least

from celery_outbox.store import records as join_parts
from celery_outbox.store.base import (
    WORKFLOW_STATUSES,
    JoinProgress,
    OutboxStore,
    StoredWorkflow,
)
from celery_outbox.store.records import WorkflowStatus
from celery_outbox.store.transitions import CANCEL, FAIL, RESUME, SUCCEED
from django_outbox._compat import raw_delete
from django_outbox.models import ChordJoin, Workflow
from django_outbox.store import rows as convert
from django_outbox.store import statements as sql
from django_outbox.store.calls import alias_of, refresh_connection, store_errors
from django_outbox.store.monitoring import bound_on, bounded_counts
from django_outbox.store.vendors import locking


def workflows(alias: str) -> QuerySet[Workflow]:
    """Every ``Workflow`` row of ``alias``."""
    rows: QuerySet[Workflow] = Workflow.objects.using(alias).all()
    return rows


def joins(alias: str) -> QuerySet[ChordJoin]:
    """Every ``ChordJoin`` row of ``alias``."""
    rows: QuerySet[ChordJoin] = ChordJoin.objects.using(alias).all()
    return rows


def mark_failed(root_id: str, task_id: str, *, now: datetime, alias: str) -> None:
    """``root_id``'s workflow ``failed`` by ``task_id`` at ``now`` unless it was cancelled:
    one ``UPDATE``.
    """
    workflows(alias).filter(root_id=root_id, status__in=FAIL.sources).update(
        status=FAIL.target, failed_task_id=task_id, finished_at=now
    )


def mark_cancelled(root_id: str, *, now: datetime, alias: str) -> None:
    """``root_id``'s running or failed workflow ``cancelled`` at ``now``, and then its
    chord joins deleted: two statements, in the caller's transaction.
    """
    closing = workflows(alias).filter(root_id=root_id, status__in=CANCEL.sources)
    if closing.update(status=CANCEL.target, finished_at=now):
        raw_delete(joins(alias).filter(root_id=root_id), alias)


def resume(root_id: str, *, alias: str) -> None:
    """``root_id``'s ``failed`` workflow ``running`` again: one ``UPDATE``."""
    workflows(alias).filter(root_id=root_id, status__in=RESUME.sources).update(
        status=RESUME.target, finished_at=None
    )


def add_steps_by_orm(root_id: str, *, name: str, steps: int, now: datetime, alias: str) -> None:
    """:meth:`DjangoWorkflows.add_workflow_steps` on a database without an upsert."""
    existing = workflows(alias).filter(root_id=root_id)
    if existing.update(steps_total=F("steps_total") + steps):
        return
    try:
        with transaction.atomic(using=alias):
            workflows(alias).create(
                root_id=root_id,
                name=name,
                status="running",
                steps_total=steps,
                steps_done=0,
                created_at=now,
            )
    except IntegrityError:  # a concurrent transaction created it first: add to its row
        existing.update(steps_total=F("steps_total") + steps)


class DjangoWorkflows(OutboxStore):
    """The workflow half of :class:`~django_outbox.store.DjangoOutboxStore`."""

    def keeps_workflows(self) -> bool:
        """Always: the Django store keeps ``Workflow`` rows and chord joins."""
        return True

    def add_workflow_steps(
        self, root_id: str, *, name: str, steps: int, now: datetime, using: str | None = None
    ) -> None:
        """Create ``root_id``'s ``running`` workflow or add ``steps`` to its total, in the
        caller's transaction: one upsert (see the module).
        """
        alias = alias_of(using)
        with store_errors("count a workflow's steps"):
            if connections[alias].vendor in sql.WORKFLOW_VENDORS:
                sql.add_workflow_steps(root_id, name=name, steps=steps, now=now, alias=alias)
            else:
                add_steps_by_orm(root_id, name=name, steps=steps, now=now, alias=alias)

    def workflow_step_done(self, root_id: str, *, now: datetime, using: str | None = None) -> None:
        """Count one step done and finish a ``running`` workflow at its last step: one
        ``UPDATE`` in the caller's transaction.
        """
        last = Q(status__in=SUCCEED.sources, steps_done__gte=F("steps_total") - 1)
        with store_errors("count a workflow step done"):
            # MySQL assigns left to right: the CASEs read steps_done before it changes.
            workflows(alias_of(using)).filter(root_id=root_id).update(
                finished_at=Case(
                    When(last, then=Value(now, output_field=DateTimeField())),
                    default=F("finished_at"),
                ),
                status=Case(When(last, then=Value(SUCCEED.target)), default=F("status")),
                steps_done=Least(F("steps_done") + 1, F("steps_total")),
            )

    def workflow_failed(
        self, root_id: str, task_id: str, *, now: datetime, using: str | None = None
    ) -> None:
        """Mark the workflow ``failed`` by ``task_id``: one ``UPDATE``."""
        with store_errors("mark a workflow failed"):
            mark_failed(root_id, task_id, now=now, alias=alias_of(using))

    def workflow_cancelled(self, root_id: str, *, now: datetime, using: str | None = None) -> None:
        """Close the workflow ``cancelled`` and delete its chord joins."""
        with store_errors("cancel a workflow"):
            mark_cancelled(root_id, now=now, alias=alias_of(using))

    def workflow_resumed(self, root_id: str, *, using: str | None = None) -> None:
        """A ``failed`` workflow ``running`` again: one ``UPDATE``."""
        with store_errors("resume a workflow"):
            resume(root_id, alias=alias_of(using))

    def get_workflow(self, root_id: str, *, using: str | None = None) -> StoredWorkflow | None:
        """``root_id``'s workflow, or ``None``."""
        alias = alias_of(using)
        refresh_connection(alias)
        with store_errors("read a workflow"):
            row = workflows(alias).filter(root_id=root_id).first()
        return None if row is None else convert.stored_workflow(row)

    def count_workflows(
        self, *, using: str | None = None, bound: int | None = None
    ) -> Mapping[WorkflowStatus, int]:
        """Workflows per status, every status present: one statement of a count per
        status, each a range of the status index (a ``GROUP BY`` over the whole table is
        a sequential scan); above ``bound``, PostgreSQL's estimate.
        """
        alias = alias_of(using)
        refresh_connection(alias)
        bound = bound_on(alias, bound)
        with store_errors("count workflows"):
            return bounded_counts(
                {s: workflows(alias).filter(status=s) for s in WORKFLOW_STATUSES}, bound
            )

    def open_join(
        self, group_id: str, *, root_id: str, size: int, now: datetime, using: str | None = None
    ) -> None:
        """Insert chord ``group_id``'s join in a savepoint; one already there stays."""
        alias = alias_of(using)
        row = ChordJoin(
            group_id=group_id,
            root_id=root_id,
            size=size,
            remaining=size,
            results=join_parts.empty_parts(size),
            created_at=now,
        )
        with store_errors("open a chord join"):
            try:
                with transaction.atomic(using=alias):
                    row.save(using=alias, force_insert=True)
            except IntegrityError:
                if not joins(alias).filter(group_id=group_id).exists():
                    raise  # not the duplicate group id: some other refused value

    def join_part(
        self, group_id: str, index: int, result: str | None, *, using: str | None = None
    ) -> JoinProgress | None:
        """Lock the join row, store header step ``index``'s result and count it (once)."""
        alias = alias_of(using)
        with store_errors("count a chord header step"), transaction.atomic(using=alias):
            found = joins(alias).filter(group_id=group_id)
            join = _locked(found).first()
            if join is None:
                return None
            parts = join_parts.with_part(join.results, index, result)
            if parts is not None:
                join.results = parts
                join.remaining = join.remaining - 1
                found.update(results=parts, remaining=join.remaining)
        results = join_parts.part_results(join.results)
        return JoinProgress(remaining=join.remaining, results=results)

    def purge_joins(self, *, older_than: datetime, limit: int, using: str | None = None) -> int:
        """Delete up to ``limit`` done joins created before ``older_than``, oldest first:
        two statements in one transaction.
        """
        alias = alias_of(using)
        refresh_connection(alias)
        with store_errors("purge chord joins"), transaction.atomic(using=alias):
            done = joins(alias).filter(remaining=0, created_at__lt=older_than)
            ids = list(done.order_by("created_at", "id").values_list("id", flat=True)[:limit])
            return raw_delete(joins(alias).filter(id__in=ids), alias) if ids else 0


def _locked(rows: QuerySet[ChordJoin]) -> QuerySet[ChordJoin]:
    """``rows`` read with ``FOR UPDATE``; where the database has none (SQLite), after an
    ``UPDATE`` that takes the write lock first (a read lock upgraded later fails at once,
    "database is locked", against a concurrent step).
    """
    if not connections[rows.db].features.has_select_for_update:
        rows.update(remaining=F("remaining"))
    return locking(rows, skip_locked=False)
