"""The ``CompletedTask`` rows of atomic tasks in the Django store.

:meth:`DjangoCompletions.complete_once` opens ``transaction.atomic(using=alias)`` and
inserts the task's row first, with the vendor's insert-or-nothing
(:func:`~django_outbox.store.statements.insert_completion`): a concurrent run of the same task
id waits on the key. When nothing was inserted, a locking read
(``SELECT ... FOR UPDATE``, which reads the latest committed row even under MySQL's
``REPEATABLE READ``) fetches the earlier run's row and the body is not run; when the
database aborts the wait instead (PostgreSQL's ``REPEATABLE READ``, a MySQL deadlock),
the transaction starts again (:func:`_open`). Otherwise
the body runs in the block, every dispatch it makes with ``using=None`` goes to the same
alias (:func:`~django_outbox.store.calls.running_on`), and the result is written before
the commit.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from datetime import datetime

from django.conf import settings as django_settings
from django.db import DEFAULT_DB_ALIAS, OperationalError, connections, transaction
from django.db.models import QuerySet

from celery_outbox.exceptions import AtomicUnsupported, StoreDataError, StoreError
from celery_outbox.store.base import Completion, OutboxStore
from celery_outbox.store.records import TASK_ID_MAX_LENGTH, TASK_NAME_MAX_LENGTH, StoredCompletion
from django_outbox._compat import raw_delete
from django_outbox.models import CompletedTask
from django_outbox.store import rows as convert
from django_outbox.store import statements as sql
from django_outbox.store.calls import refresh_connection, running_on, store_errors
from django_outbox.store.vendors import locking

#: Inserts tried before giving up on a task id whose row vanishes in between (a purge).
_TRIES = 2
#: Transactions started before giving up when the database aborts them (:func:`_open`).
_STARTS = 3
#: The first SQLite with ``INSERT ... ON CONFLICT DO NOTHING``.
_SQLITE_UPSERT = (3, 24, 0)
#: MySQL/MariaDB ``ER_LOCK_DEADLOCK``.
_MYSQL_DEADLOCK = 1213


def completed(alias: str) -> QuerySet[CompletedTask]:
    """Every ``CompletedTask`` row of ``alias``."""
    rows: QuerySet[CompletedTask] = CompletedTask.objects.using(alias).all()
    return rows


class _Body:
    """What the body of a ``complete_once`` block raised (left unwrapped)."""

    def __init__(self) -> None:
        self.error: BaseException | None = None

    def raised(self, exc: BaseException) -> bool:
        return exc is self.error


class DjangoCompletions(OutboxStore):
    """The atomic-task half of :class:`~django_outbox.store.DjangoOutboxStore`."""

    def atomic_problem(self, using: str | None = None) -> str | None:
        """``None`` when ``using`` is in ``DATABASES`` and is PostgreSQL, SQLite 3.24+ or
        MySQL/MariaDB; else why not.
        """
        alias = using or DEFAULT_DB_ALIAS
        if alias not in django_settings.DATABASES:
            known = ", ".join(django_settings.DATABASES)
            return f"no database alias {alias!r} in DATABASES (aliases: {known})"
        vendor = connections[alias].vendor
        if vendor not in sql.COMPLETION_VENDORS:
            return (
                f"database {alias!r} is {vendor}: atomic tasks run on PostgreSQL, SQLite "
                "and MySQL/MariaDB"
            )
        if vendor == "sqlite" and sqlite3.sqlite_version_info < _SQLITE_UPSERT:
            return (
                f"database {alias!r} is SQLite {sqlite3.sqlite_version}: atomic tasks need "
                "SQLite 3.24 or later (INSERT ... ON CONFLICT DO NOTHING)"
            )
        return None

    @contextlib.contextmanager
    def complete_once(
        self,
        task_id: str,
        task_name: str,
        *,
        now: datetime,
        using: str | None = None,
        root_id: str | None = None,
    ) -> Iterator[Completion]:
        """``transaction.atomic(using=...)`` that inserts the task's row first (see the
        module); database errors of the store's own statements, or of the commit, leave as
        ``StoreError``, the body's own exceptions unchanged.
        """
        alias = using or DEFAULT_DB_ALIAS
        problem = self.atomic_problem(alias)
        if problem is not None:
            raise AtomicUnsupported(f"Atomic task {task_name!r} cannot run: {problem}.")
        _check_identifiers(task_id, task_name, root_id)
        body = _Body()
        with (
            store_errors("run an atomic task's transaction", unless=body.raised),
            running_on(alias),
        ):
            opened, completion = _open(task_id, task_name, now=now, root_id=root_id, alias=alias)
            with opened:
                try:
                    yield completion
                except BaseException as exc:
                    body.error = exc
                    raise
                if completion.previous is None and completion.result is not None:
                    sql.set_result(task_id, completion.result, alias=alias)

    def completion(self, task_id: str, *, using: str | None = None) -> StoredCompletion | None:
        """The committed ``CompletedTask`` row of ``task_id``, or ``None``."""
        with store_errors("read a completed task"):
            row = completed(using or DEFAULT_DB_ALIAS).filter(task_id=task_id).first()
        return None if row is None else convert.stored_completion(row)

    def count_completed(self, *, using: str | None = None) -> int:
        """How many ``CompletedTask`` rows there are: one ``COUNT``."""
        alias = using or DEFAULT_DB_ALIAS
        refresh_connection(alias)
        with store_errors("count completed tasks"):
            return completed(alias).count()

    def purge_completed(self, *, older_than: datetime, limit: int, using: str | None = None) -> int:
        """Delete the oldest ``limit`` rows completed before ``older_than``: two statements
        (MySQL cannot ``DELETE ... WHERE id IN (SELECT ... LIMIT n)``).
        """
        alias = using or DEFAULT_DB_ALIAS
        refresh_connection(alias)
        with store_errors("purge completed tasks"):
            old = completed(alias).filter(completed_at__lt=older_than)
            ids = list(old.order_by("completed_at", "id").values_list("id", flat=True)[:limit])
            return raw_delete(completed(alias).filter(id__in=ids), alias) if ids else 0


def _open(
    task_id: str, task_name: str, *, now: datetime, root_id: str | None, alias: str
) -> tuple[contextlib.ExitStack, Completion]:
    """Enter ``transaction.atomic`` and :func:`_begin`; the open transaction and its run.

    An outermost transaction that the database aborts before the body (nothing has run
    yet) starts again, up to :data:`_STARTS` times: under PostgreSQL's ``REPEATABLE
    READ`` a duplicate that waited on the key gets a serialization failure (it cannot see
    the row committed after its snapshot), and on MySQL/MariaDB two duplicates waiting on
    a run that rolled back may deadlock on the key.
    """
    starts_left = _STARTS if not connections[alias].in_atomic_block else 1
    while True:
        starts_left -= 1
        opened = contextlib.ExitStack()
        opened.enter_context(transaction.atomic(using=alias))
        try:
            return opened, _begin(task_id, task_name, now=now, root_id=root_id, alias=alias)
        except BaseException as exc:
            opened.__exit__(type(exc), exc, exc.__traceback__)  # rolls back
            if not starts_left or not _aborted_by_the_database(exc):
                raise


def _aborted_by_the_database(exc: BaseException) -> bool:
    """A serialization failure or deadlock: SQLSTATE 40001/40P01 (psycopg's ``sqlstate``,
    psycopg2's ``pgcode``), MySQL error 1213.
    """
    if not isinstance(exc, OperationalError):
        return False
    cause = exc.__cause__
    states = {getattr(cause, "sqlstate", None), getattr(cause, "pgcode", None)}
    mysql_code = cause.args[0] if cause is not None and cause.args else None
    return bool(states & {"40001", "40P01"}) or mysql_code == _MYSQL_DEADLOCK


def _begin(
    task_id: str, task_name: str, *, now: datetime, root_id: str | None, alias: str
) -> Completion:
    """Insert the row, or read the earlier run's (locking it until this block ends)."""
    for _ in range(_TRIES):
        if sql.insert_completion(task_id, task_name, now=now, root_id=root_id, alias=alias):
            return Completion(task_id, task_name)
        previous = locking(completed(alias).filter(task_id=task_id), skip_locked=False).first()
        if previous is not None:
            return Completion(task_id, task_name, previous=convert.stored_completion(previous))
    raise StoreError(
        f"celery-outbox could not record atomic task {task_name!r} (id {task_id!r}): its "
        f"CompletedTask row was neither inserted nor found, {_TRIES} times (purged meanwhile?)."
    )


def _check_identifiers(task_id: str, task_name: str, root_id: str | None) -> None:
    """Refuse values MySQL's ``INSERT IGNORE`` would cut short instead of refusing."""
    for what, value, longest in (
        ("task id", task_id, TASK_ID_MAX_LENGTH),
        ("task name", task_name, TASK_NAME_MAX_LENGTH),
        ("root id", "" if root_id is None else root_id, TASK_ID_MAX_LENGTH),
    ):
        if not isinstance(value, str) or len(value) > longest:
            raise StoreDataError(
                f"celery-outbox cannot record atomic task {task_name!r}: its {what} "
                f"{value!r:.300} does not fit CompletedTask (a str of at most {longest} "
                "characters)."
            )
