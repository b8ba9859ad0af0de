"""The SQLAlchemy store's claim reads its batch, not the backlog, on PostgreSQL.

As for the Django store (``tests/django/test_claim_plans.py``): the due rows are read
along the due index ``(status, available_at)``; ordering by ``(available_at, id)`` made
PostgreSQL read and sort every row due at the same instant to lease the first batch. The
statement is the one the store runs (with and without a byte budget), explained with
``ANALYZE`` in a transaction that is rolled back.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.engine import Engine

from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore
from celery_outbox.store.records import OUTBOX_TABLE
from tests.outbox_seed import pending_rows

pytestmark = pytest.mark.postgres

BACKLOG = 20_000
BATCH = 500

SEED = pending_rows(BACKLOG, "backlog-")


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """``plan`` and every node under it."""
    yield plan
    for child in plan.get("Plans", ()):
        yield from nodes(child)


def rows_read(engine: Engine, statement: str, parameters: Any) -> int:
    """How many outbox rows the candidate scans (the claim's CTEs) returned when run."""
    with engine.connect() as conn:
        (document,) = conn.exec_driver_sql(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + statement, parameters
        ).one()
        conn.rollback()
    plan = (json.loads(document) if isinstance(document, str) else document)[0]["Plan"]
    ctes = [n for n in nodes(plan) if str(n.get("Subplan Name", "")).startswith("CTE")]
    scans = [
        node for cte in ctes for node in nodes(cte) if node.get("Relation Name") == OUTBOX_TABLE
    ]
    assert scans, plan
    return sum(int(node["Actual Rows"]) for node in scans)


@pytest.mark.parametrize("max_bytes", [None, 10**9])
def test_a_claim_reads_its_batch_not_the_whole_backlog(
    pg_engine: Engine, max_bytes: int | None
) -> None:
    with pg_engine.begin() as conn:
        conn.execute(text(SEED))
    with pg_engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(
            text(f"ANALYZE {OUTBOX_TABLE}")
        )
    store = SQLAlchemyOutboxStore(engine=pg_engine)
    seen: list[tuple[str, Any]] = []

    def record(_conn: object, _cursor: object, statement: str, parameters: Any, *_: Any) -> None:
        if statement.lstrip().upper().startswith(("WITH", "UPDATE")):
            seen.append((statement, parameters))

    now = datetime.now(timezone.utc)
    event.listen(pg_engine, "before_cursor_execute", record)
    try:
        claim = store.claim_due(
            now=now,
            created_before=now,
            limit=BATCH,
            lease_until=now + timedelta(seconds=60),
            max_bytes=max_bytes,
        )
    finally:
        event.remove(pg_engine, "before_cursor_execute", record)
    assert len(claim.messages) == BATCH
    (statement, parameters) = seen[-1]
    assert rows_read(pg_engine, statement, parameters) <= 2 * BATCH
