"""Claims, cut at a byte budget.

On PostgreSQL in one statement, ``WITH claim AS (SELECT ... FOR UPDATE SKIP LOCKED)
UPDATE ... RETURNING *`` run in autocommit, which keeps the candidates whose predecessors
hold fewer bytes than the budget (a running sum of ``octet_length(payload)``, which reads
a stored value's size without decompressing it). Elsewhere :func:`lock_within_budget`
locks the candidates reading only ids and sizes.

The ORM path (``SELECT ... FOR UPDATE`` then ``UPDATE`` in a transaction) costs four round
trips (BEGIN, SELECT, UPDATE, COMMIT); this costs one, on the hot path of every on-commit
publish and every sweep batch. The ``status = 'pending'`` literal lets PostgreSQL use the
partial indexes.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db.models.functions import Length

from celery_outbox.records import OUTBOX_TABLE
from celery_outbox.storage import within_budget
from django_outbox.managers import OutboxMessageQuerySet, locking
from django_outbox.models import OutboxMessage

_CLAIM = (
    "WITH claim AS ("
    f"SELECT id, available_at, octet_length(payload) AS size FROM {OUTBOX_TABLE} "
    "WHERE {where} AND status = 'pending' "
    "AND available_at <= %s AND (locked_until IS NULL OR locked_until <= %s) "
    "ORDER BY available_at, id {limit} FOR UPDATE SKIP LOCKED), "
    # Each row whose predecessors hold fewer than the budget: never an empty claim.
    "budget AS (SELECT id, sum(size) OVER (ORDER BY available_at, id) - size AS before "
    "FROM claim) "
    f"UPDATE {OUTBOX_TABLE} SET locked_until = %s "
    "WHERE id IN (SELECT id FROM budget WHERE %s::bigint IS NULL OR before < %s::bigint) "
    "RETURNING *"
)


def claim_ids(
    ids: Sequence[int],
    *,
    now: datetime,
    lease_until: datetime,
    max_bytes: int | None,
    alias: str,
) -> list[OutboxMessage]:
    """Lease those of ``ids`` that are pending, due and unleased, within ``max_bytes``."""
    sql = _CLAIM.format(where="id = ANY(%s)", limit="")
    return _run(sql, [list(ids), now, now, lease_until, max_bytes, max_bytes], alias)


def claim_due(
    *,
    now: datetime,
    created_before: datetime,
    limit: int,
    lease_until: datetime,
    max_bytes: int | None,
    alias: str,
) -> list[OutboxMessage]:
    """Lease up to ``limit`` due rows past their grace (or parked), oldest due first, and
    no row after the one that brings the claim to ``max_bytes`` of payload."""
    sql = _CLAIM.format(where="(created_at <= %s OR available_at > created_at)", limit="LIMIT %s")
    params = [created_before, now, now, limit, lease_until, max_bytes, max_bytes]
    return _run(sql, params, alias)


def lock_within_budget(
    rows: OutboxMessageQuerySet, limit: int | None, max_bytes: int | None
) -> list[int]:
    """Lock up to ``limit`` of ``rows`` (any database, inside a transaction) reading only
    their ids and sizes; the ids a claim of ``max_bytes`` takes, so no payload beyond
    the budget leaves the database."""
    locked = locking(rows, skip_locked=True).annotate(size=Length("payload"))
    sized = list((locked[:limit] if limit is not None else locked).values_list("id", "size"))
    return [row_id for row_id, _ in sized[: within_budget((s for _, s in sized), max_bytes)]]


def _run(sql: str, params: list[Any], alias: str) -> list[OutboxMessage]:
    rows = list(OutboxMessage.objects.db_manager(alias).raw(sql, params))
    return sorted(rows, key=lambda row: (row.available_at, row.id))
