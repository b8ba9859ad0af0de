"""A claim reads its batch, not the backlog, on PostgreSQL (issue 20's sweep).

The due rows are read along the due index ``(status, available_at)``. Ordering the claim
by ``(available_at, id)`` instead made PostgreSQL read and sort every row due at the same
instant to lease the first 500 (the index's entries do not end with the id, so ties are
sorted by id after the scan): a backlog written at one instant (a bulk dispatch, rows
whose process died after one COMMIT, the sweep benchmark's seed) cost ~12 ms per claim
at 20,000 rows, growing with the backlog. The statement is the one the store runs,
explained with ``ANALYZE`` in a transaction that is rolled back.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from celery_outbox.store.records import OUTBOX_TABLE
from tests.django.helpers import later
from tests.outbox_seed import pending_rows

pytestmark = pytest.mark.django_db(transaction=True)

BACKLOG = 20_000
BATCH = 500

SEED = [
    pending_rows(BACKLOG, "backlog-"),
    f"ANALYZE {OUTBOX_TABLE}",  # as autovacuum leaves a table this size
]


class _RolledBack(Exception):
    """Ends the explaining transaction."""


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """``plan`` and every node under it."""
    yield plan
    for child in plan.get("Plans", ()):
        yield from nodes(child)


def rows_read_by_the_claim(sql: str) -> int:
    """How many outbox rows the candidate scan of the claim ``sql`` returned when run."""
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql)
            (document,) = cursor.fetchone()
            raise _RolledBack(document)
    except _RolledBack as done:
        document = done.args[0]
    plan = (json.loads(document) if isinstance(document, str) else document)[0]["Plan"]
    (claim,) = [node for node in nodes(plan) if node.get("Subplan Name") == "CTE claim"]
    scans = [node for node in nodes(claim) if node.get("Relation Name") == OUTBOX_TABLE]
    assert scans, claim
    return sum(int(node["Actual Rows"]) for node in scans)


def test_a_claim_reads_its_batch_not_the_whole_backlog(store: Any, now: datetime) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("plans are PostgreSQL's")
    with connection.cursor() as cursor:
        for statement in SEED:
            cursor.execute(statement)

    with CaptureQueriesContext(connection) as queries:
        claim = store.claim_due(
            now=now, created_before=now, limit=BATCH, lease_until=later(now, 60)
        )
    assert len(claim.messages) == BATCH
    times = [m.available_at for m in claim.messages]
    assert times == sorted(times)
    # The oldest due first: nothing left unclaimed is due before the claim's last row.
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT min(available_at) FROM {OUTBOX_TABLE} WHERE locked_until IS NULL")
        (oldest_left,) = cursor.fetchone()
    assert oldest_left >= times[-1]

    (sql,) = [q["sql"] for q in queries if q["sql"].startswith("WITH claim AS")]
    assert rows_read_by_the_claim(sql) <= 2 * BATCH
