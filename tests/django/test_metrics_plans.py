"""The Django store's scrape over a million outbox rows on PostgreSQL reads only indexes:
every statement of a scrape is EXPLAINed (issue 18; the SQLAlchemy store's:
tests/integration/test_metrics_scale.py; the time: the ``scrape`` benchmark).
"""

from __future__ import annotations

import pytest
from celery import Celery
from django.db import connection
from django.test.utils import CaptureQueriesContext

from benchmarks.scrape import seed_statements
from celery_outbox.registry import install_store
from celery_outbox.store.records import DEAD_LETTER_TABLE, OUTBOX_TABLE, SWEEP_TABLE, WORKFLOW_TABLE
from django_outbox.store import DjangoOutboxStore

prometheus_client = pytest.importorskip("prometheus_client")

from celery_outbox.metrics import OutboxCollector  # noqa: E402 - after the skip

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROWS = 1_000_000
BIG = (OUTBOX_TABLE, DEAD_LETTER_TABLE, WORKFLOW_TABLE)


def seed() -> None:
    with connection.cursor() as cursor:
        for statement in seed_statements(ROWS):
            cursor.execute(statement)
        for table in BIG:
            cursor.execute(f"VACUUM ANALYZE {table}")  # autocommit: outside a transaction


def explain(sql: str) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + sql)
        return [str(row[0]) for row in cursor.fetchall()]


def test_every_statement_of_a_scrape_reads_an_index_never_the_whole_table() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("plans are PostgreSQL's")
    seed()
    app = Celery("metrics-plans", set_as_current=False)
    install_store(app, DjangoOutboxStore())
    registry = prometheus_client.CollectorRegistry()
    registry.register(OutboxCollector(app))

    with CaptureQueriesContext(connection) as queries:
        page = prometheus_client.generate_latest(registry).decode()

    assert "celery_outbox_scrape_error 0.0" in page
    parked = float(page.split("\ncelery_outbox_parked ")[1].split()[0])
    assert abs(parked - ROWS * 0.14) < ROWS * 0.14 * 0.1  # the planner's estimate
    statements = [q["sql"] for q in queries.captured_queries]
    # past the bound, the planner's estimates: EXPLAINs (planned, never run)
    estimates = [s for s in statements if s.lstrip().startswith("EXPLAIN")]
    reads = [s for s in statements if any(table in s for table in BIG) and s not in estimates]
    # the backlog (the parked and failed rows' counts, then the due rows'), the dead
    # letters and the workflows (a statement each, of one count per status), each count
    # at most bound + 1 entries of an index
    assert len(reads) == 4
    assert [s.count("LIMIT") for s in reads] == [2, 1, 4, 4], reads
    others = [s for s in statements if s not in reads and s not in estimates]
    assert all(SWEEP_TABLE in s or "statement_timestamp" in s for s in others), others
    for sql in reads:
        plan = explain(sql)
        assert not any("Seq Scan" in line for line in plan), (sql, plan)
        assert not any("Gather" in line for line in plan), (sql, plan)
        assert any("Index" in line and "Scan" in line for line in plan), (sql, plan)
