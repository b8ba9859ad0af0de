"""A scrape over a million outbox rows (parked and published mixed) on PostgreSQL reads
only indexes: every statement of a scrape is EXPLAINed (issue 18; the time of a scrape is
the ``scrape`` benchmark's, docs/benchmarks.md).

The rows are :mod:`benchmarks.scrape`'s: 85 % published rows kept, 14 % parked retries,
1 % failed, a few due, and 50,000 dead letters and workflows of every status, then
``VACUUM ANALYZE`` as autovacuum leaves a table.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("sqlalchemy")
pytest.importorskip("prometheus_client")

from celery import Celery
from prometheus_client import CollectorRegistry, generate_latest
from sqlalchemy import Engine, event, text

from benchmarks.scrape import seed_statements
from celery_outbox.metrics import OutboxCollector
from celery_outbox.registry import install_store
from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore, metadata
from celery_outbox.store.records import DEAD_LETTER_TABLE, OUTBOX_TABLE, SWEEP_TABLE, WORKFLOW_TABLE
from tests.integration.sweep_app import engine_for

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

ROWS = 1_000_000


@pytest.fixture
def engine(postgres_database_url: str) -> Iterator[Engine]:
    engine = engine_for(postgres_database_url)
    metadata.create_all(engine)
    with engine.begin() as conn:
        for statement in seed_statements(ROWS):
            conn.execute(text(statement))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for table in (OUTBOX_TABLE, DEAD_LETTER_TABLE, WORKFLOW_TABLE):
            conn.execute(text(f"VACUUM ANALYZE {table}"))
    yield engine
    engine.dispose()


def scrape_statements(engine: Engine) -> list[tuple[str, Any]]:
    """The statements (and parameters) one scrape runs."""
    app = Celery("metrics-scale", set_as_current=False)
    install_store(app, SQLAlchemyOutboxStore(engine=engine))
    registry = CollectorRegistry()
    registry.register(OutboxCollector(app))
    seen: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        seen.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", record)
    try:
        page = generate_latest(registry).decode()
    finally:
        event.remove(engine, "before_cursor_execute", record)
    assert "celery_outbox_scrape_error 0.0" in page
    parked = float(page.split("\ncelery_outbox_parked ")[1].split()[0])
    assert abs(parked - ROWS * 0.14) < ROWS * 0.14 * 0.1  # the planner's estimate
    return seen


def explain(engine: Engine, statement: str, parameters: Any) -> list[str]:
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        cursor.execute("EXPLAIN " + statement, parameters)
        plan = [str(row[0]) for row in cursor.fetchall()]
        raw.rollback()
        return plan
    finally:
        raw.close()


def test_every_statement_of_a_scrape_reads_an_index_never_the_whole_table(
    engine: Engine,
) -> None:
    statements = scrape_statements(engine)
    big = (OUTBOX_TABLE, DEAD_LETTER_TABLE, WORKFLOW_TABLE)
    # past the bound, the planner's estimates: EXPLAINs (planned, never run)
    estimates = [s for s in statements if s[0].startswith("EXPLAIN")]
    # the backlog (3), the dead letters (4 statuses), the workflows (4): each at most
    # bound + 1 entries of an index; the one-row sweep table and the clock aside
    tables = [s for s in statements if any(name in s[0] for name in big) and s not in estimates]
    assert len(tables) == 11
    assert all("LIMIT" in s[0] for s in tables), tables
    assert len(estimates) <= len(tables)
    others = [s for s in statements if s not in tables and s not in estimates]
    assert all(SWEEP_TABLE in s[0] or "now()" in s[0] for s in others), others

    plans = {statement: explain(engine, statement, parameters) for statement, parameters in tables}

    report = "\n\n".join(f"{s}\n" + "\n".join(plan) for s, plan in plans.items())
    print("\n" + report)
    for statement, plan in plans.items():
        assert not any("Seq Scan" in line for line in plan), statement
        assert not any("Gather" in line for line in plan), statement
        # one index range per count: as many index scans as the statement counts
        scans = sum("Index" in line and "Scan" in line for line in plan)
        assert scans >= statement.count("count("), (statement, plan)
