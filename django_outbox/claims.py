"""Claims in one statement on PostgreSQL: ``UPDATE ... WHERE id IN (SELECT ... FOR UPDATE
SKIP LOCKED) RETURNING *``, run in autocommit.

The ORM path (``SELECT ... FOR UPDATE`` then ``UPDATE`` in a transaction) costs four round
trips (BEGIN, SELECT, UPDATE, COMMIT); this costs one, on the hot path of every on-commit
publish and every sweep batch. The ``status = 'pending'`` literal lets PostgreSQL use the
partial indexes.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from celery_outbox.records import OUTBOX_TABLE
from django_outbox.models import OutboxMessage

_CLAIM = (
    f"UPDATE {OUTBOX_TABLE} SET locked_until = %s WHERE id IN ("
    f"SELECT id FROM {OUTBOX_TABLE} WHERE {{where}} AND status = 'pending' "
    "AND available_at <= %s AND (locked_until IS NULL OR locked_until <= %s) "
    "ORDER BY available_at, id {limit} FOR UPDATE SKIP LOCKED) RETURNING *"
)


def claim_ids(
    ids: Sequence[int], *, now: datetime, lease_until: datetime, alias: str
) -> list[OutboxMessage]:
    """Lease those of ``ids`` that are pending, due and unleased."""
    sql = _CLAIM.format(where="id = ANY(%s)", limit="")
    return _run(sql, [lease_until, list(ids), now, now], alias)


def claim_due(
    *, now: datetime, created_before: datetime, limit: int, lease_until: datetime, alias: str
) -> list[OutboxMessage]:
    """Lease up to ``limit`` due rows past their grace (or parked), oldest due first."""
    sql = _CLAIM.format(where="(created_at <= %s OR available_at > created_at)", limit="LIMIT %s")
    return _run(sql, [lease_until, created_before, now, now, limit], alias)


def _run(sql: str, params: list[Any], alias: str) -> list[OutboxMessage]:
    rows = list(OutboxMessage.objects.db_manager(alias).raw(sql, params))
    return sorted(rows, key=lambda row: (row.available_at, row.id))
