"""The Django store's part in waking the relay (:mod:`celery_outbox.wakeups`).

PostgreSQL databases get a LISTEN connection of their own, opened with the settings
Django connects with but not managed by Django (no transaction, no pool, never closed
by ``close_old_connections``); other databases poll. The next parked row's due time is
one probe of the due-row index on every database.
"""

from __future__ import annotations

import functools
from datetime import datetime

from django.db import connections
from django.db.models import Min

from celery_outbox.records import MessageStatus
from celery_outbox.storage import OutboxStore
from celery_outbox.wakeups import Connector
from django_outbox._compat import new_connection
from django_outbox.store.calls import alias_of, refresh_connection, store_errors
from django_outbox.store.orm import messages


class DjangoWakeups(OutboxStore):
    """The wake-up half of :class:`~django_outbox.store.DjangoOutboxStore`."""

    def next_due(self, *, after: datetime, using: str | None = None) -> datetime | None:
        """The first ``available_at`` after ``after`` of a pending row (the due-row index)."""
        alias = alias_of(using)
        refresh_connection(alias)
        with store_errors("read the next due row"):
            later = messages(alias).filter(
                status=MessageStatus.PENDING.value, available_at__gt=after
            )
            found: datetime | None = later.aggregate(first=Min("available_at"))["first"]
        return found

    def listen_connector(self, *, using: str | None = None) -> Connector | None:
        """PostgreSQL: a new connection to ``using``'s database; elsewhere ``None``."""
        alias = alias_of(using)
        if connections[alias].vendor != "postgresql":
            return None
        return functools.partial(new_connection, alias)
