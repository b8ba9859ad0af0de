"""The sweep record on PostgreSQL, counted by the database itself: a skipped record leaves
the row untouched (same version, no lock), and sweepers looping at once write it at most
once per interval between them (a trigger counts every write).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery

from celery_outbox.config import OutboxConfig
from celery_outbox.registry import install_store
from celery_outbox.relay.relay import relay_for
from celery_outbox.relay.sweeper import Sweeper
from tests.contract.conftest import STORES
from tests.contract.harness import DjangoHarness, Harness, SQLAlchemyHarness

POSTGRES_STORES = [p for p in STORES if p.id in ("sqlalchemy-postgresql", "django")]
INTERVAL = 0.5

COUNT_WRITES = """
CREATE TABLE sweep_writes (at timestamptz NOT NULL);
CREATE FUNCTION count_sweep_write() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN INSERT INTO sweep_writes VALUES (NEW.last_sweep_at); RETURN NEW; END $$;
CREATE TRIGGER count_sweep_writes AFTER INSERT OR UPDATE ON celery_outbox_sweep
  FOR EACH ROW EXECUTE FUNCTION count_sweep_write();
"""
STOP_COUNTING = """
DROP TRIGGER IF EXISTS count_sweep_writes ON celery_outbox_sweep;
DROP FUNCTION IF EXISTS count_sweep_write();
DROP TABLE IF EXISTS sweep_writes;
"""


def sql(h: Harness, statement: str) -> list[tuple[Any, ...]]:
    """Run ``statement`` on the harness's database, committed; its rows, if any."""
    if isinstance(h, SQLAlchemyHarness):
        with h.engine.begin() as conn:
            result = conn.exec_driver_sql(statement)
            return [tuple(r) for r in result] if result.returns_rows else []
    assert isinstance(h, DjangoHarness)
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(statement)
        return list(cursor.fetchall()) if cursor.description else []


@pytest.fixture
def writes_counted(harness: Harness) -> Iterator[None]:
    sql(harness, STOP_COUNTING + COUNT_WRITES)
    yield
    sql(harness, STOP_COUNTING)


@pytest.mark.parametrize("harness", POSTGRES_STORES, indirect=True)
def test_a_skipped_record_leaves_the_row_version_and_takes_no_lock(harness: Harness) -> None:
    assert harness.store.record_sweep(every=timedelta(hours=1))
    version = "SELECT xmin::text, xmax::text FROM celery_outbox_sweep"
    before = sql(harness, version)

    for _ in range(3):
        assert not harness.store.record_sweep(every=timedelta(hours=1))

    assert sql(harness, version) == before
    assert before[0][1] == "0"  # never locked either


@pytest.mark.parametrize("harness", POSTGRES_STORES, indirect=True)
def test_sweepers_looping_at_once_write_at_most_once_per_interval(
    harness: Harness, writes_counted: None
) -> None:
    app = Celery("sweep-record-pg", broker="memory://", set_as_current=False)
    app.conf.outbox_sweep_interval = INTERVAL
    install_store(app, harness.store)
    config = OutboxConfig.from_celery(app)
    stop = threading.Event()

    def relay_loop() -> None:
        sweeper = Sweeper(app=app, store=harness.store, relay=relay_for(app), config=config)
        harness.in_thread(lambda: sweeper.run(stop, poll=0.01))

    loops = [threading.Thread(target=relay_loop) for _ in range(3)]
    for loop in loops:
        loop.start()
    stop.wait(2.2)
    stop.set()
    for loop in loops:
        loop.join(timeout=30)
    app.close()

    ((writes,),) = sql(harness, "SELECT count(*) FROM sweep_writes")
    # ~2.2 s of three loops sweeping every 10 ms: 4 or 5 writes, never two within an interval
    assert 3 <= writes <= 5
    gaps = sql(
        harness,
        "SELECT extract(epoch FROM at - lag(at) OVER (ORDER BY at)) FROM sweep_writes",
    )
    assert all(gap is None or float(gap) >= INTERVAL for (gap,) in gaps), gaps
