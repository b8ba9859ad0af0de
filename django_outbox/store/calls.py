"""What every method of the Django store shares: the alias a call works on, the clock,
and how a database error leaves it (the core's one translation, :mod:`celery_outbox.store.errors`).

``using=None`` means the alias of the atomic task running in this context
(:meth:`~django_outbox.store.completions.DjangoCompletions.complete_once` binds it),
else ``"default"``: a task dispatched from an atomic task's body joins the body's
transaction whatever database it runs on.

The clock of each database alias: the server's, read through a :class:`DatabaseClock`.

``statement_timestamp()`` on PostgreSQL and ``UTC_TIMESTAMP(6)`` on MySQL/MariaDB, read
once per :data:`~celery_outbox.clock.CLOCK_READ_EVERY` and advanced on this
process's monotonic clock in between (no round trip per dispatch); on SQLite and other
databases, which have no server of their own, this process's clock.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from contextvars import ContextVar
from datetime import datetime, timezone
from typing import cast

from django.db import DEFAULT_DB_ALIAS, DatabaseError, DataError, IntegrityError, connections

from celery_outbox.clock import DatabaseClock, utcnow
from celery_outbox.exceptions import StoreError
from celery_outbox.store import errors

# --- What every method of the Django store shares: the alias a call works on, and how a

#: The alias of the atomic task whose transaction is open in this context.
_RUNNING: ContextVar[str | None] = ContextVar("django_outbox_atomic_alias", default=None)


def alias_of(using: str | None) -> str:
    """``using``, else the running atomic task's alias, else ``"default"``.

    Raises
    ------
    StoreError
        The alias is not in ``DATABASES`` (say, removed from settings while
        ``DJANGO_OUTBOX_DATABASES`` still lists it): an error naming it, not Django's
        ``ConnectionDoesNotExist``, so a sweep of several databases goes on with the others.
    """
    alias = using or _RUNNING.get() or DEFAULT_DB_ALIAS
    if alias not in connections.settings:
        raise StoreError(
            f"celery-outbox: database alias {alias!r} is not in DATABASES (its aliases: "
            f"{', '.join(map(repr, connections.settings))}). If it was removed while "
            "DJANGO_OUTBOX_DATABASES still lists it, its outbox rows wait in that database "
            "until the alias is restored; remove it from DJANGO_OUTBOX_DATABASES once they "
            "are published."
        )
    return alias


@contextlib.contextmanager
def running_on(alias: str) -> Iterator[None]:
    """Make ``alias`` what ``using=None`` means inside the block (an atomic task's run)."""
    token = _RUNNING.set(alias)
    try:
        yield
    finally:
        _RUNNING.reset(token)


def store_errors(
    action: str, *, unless: Callable[[BaseException], bool] | None = None
) -> AbstractContextManager[None]:
    """Raise a database error as ``StoreError``, a refused value as ``StoreDataError``
    (:func:`celery_outbox.store.errors.store_errors` with Django's exception classes;
    never swallowed: the caller's transaction still rolls back).

    An error ``unless`` accepts (a task body's own) leaves unchanged.
    """
    return errors.store_errors(
        action,
        data=(DataError, IntegrityError),
        outage=(DatabaseError,),
        unless=unless or _never,
        after_refused=_drop_broken_connections,
    )


def _never(exc: BaseException) -> bool:
    return False


def _drop_broken_connections() -> None:
    """Close the connections a refused value broke (MariaDB drops a connection after a
    packet over ``max_allowed_packet``), outside atomic blocks: the next call reconnects.
    """
    for connection in connections.all(initialized_only=True):
        if not connection.in_atomic_block:
            connection.close_if_unusable_or_obsolete()


def refresh_connection(alias: str) -> None:
    """``close_old_connections()`` for one alias, for batch work outside a request.

    Never inside an atomic block: Django would close the connection in the middle of it.
    """
    connection = connections[alias]
    if not connection.in_atomic_block:
        connection.close_if_unusable_or_obsolete()


# --- The clock of each database alias: the server's, read through a :class:`DatabaseClock`.

#: How each vendor reads its clock (others: this process's clock).
_NOW_SQL = {"postgresql": "SELECT statement_timestamp()", "mysql": "SELECT UTC_TIMESTAMP(6)"}

_clocks: dict[str, DatabaseClock] = {}


def database_now(alias: str) -> datetime:
    """The current time of database ``alias``, aware UTC: one read (none on SQLite)."""
    connection = connections[alias]
    query = _NOW_SQL.get(connection.vendor)
    if query is None:
        return utcnow()
    with connection.cursor() as cursor:
        cursor.execute(query)
        now = cast(datetime, cursor.fetchone()[0])
    return now.replace(tzinfo=timezone.utc) if now.tzinfo is None else now.astimezone(timezone.utc)


def clock_of(alias: str) -> Callable[[], datetime]:
    """The clock of database ``alias``: what every time the store writes or compares is
    read from (no read per call on a server database; this process's clock on SQLite).
    """
    clock = _clocks.get(alias)
    if clock is not None:
        return clock
    if connections[alias].vendor not in _NOW_SQL:
        return utcnow
    return _clocks.setdefault(alias, DatabaseClock(functools.partial(database_now, alias)))
