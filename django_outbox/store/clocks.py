"""The clock of each database alias: the server's, read through a :class:`DatabaseClock`.

``statement_timestamp()`` on PostgreSQL and ``UTC_TIMESTAMP(6)`` on MySQL/MariaDB, read
once per :data:`~celery_outbox.database_clock.CLOCK_READ_EVERY` and advanced on this
process's monotonic clock in between (no round trip per dispatch); on SQLite and other
databases, which have no server of their own, this process's clock.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import datetime, timezone
from typing import cast

from django.db import connections

from celery_outbox.clock import utcnow
from celery_outbox.database_clock import DatabaseClock

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
    read from (no read per call on a server database; this process's clock on SQLite)."""
    clock = _clocks.get(alias)
    if clock is not None:
        return clock
    if connections[alias].vendor not in _NOW_SQL:
        return utcnow
    return _clocks.setdefault(alias, DatabaseClock(functools.partial(database_now, alias)))
