"""A transaction of many large dispatches is published a byte budget at a time (issue 13 #7).

On real PostgreSQL and Redis: kombu pipelines a batch of publishes, holding every encoded
body until the flush, so the relay publishes at most ``outbox_sweep_batch_bytes`` of
payload per batch. What the commit allocates beyond the rows the transaction already
holds stays near one budget, whatever the number of dispatches.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator

import pytest
from celery import Celery
from sqlalchemy import select
from sqlalchemy.orm import Session

from celery_outbox.registry import store_for
from celery_outbox.relay.relay import relay_for
from celery_outbox.sqlalchemy import outbox_table
from tests.integration.sweep_app import RECORD, create_app, create_tables
from tests.integration.sweep_support import free_port, queued_count

ROWS, SIZE, BUDGET = 24, 1_000_000, 2 * 1024 * 1024
MIB = 1024 * 1024


@pytest.fixture
def app(postgres_database_url: str, redis_url: str, queue_name: str) -> Iterator[Celery]:
    create_tables(postgres_database_url)
    app = create_app(redis_url, queue_name, postgres_database_url, outbox_sweep_batch_bytes=BUDGET)
    yield app
    relay_for(app).close()
    store_for(app).engine.dispose()  # type: ignore[attr-defined]
    app.close()


def test_a_commit_of_many_large_dispatches_holds_one_budget_of_bodies_at_a_time(
    app: Celery, redis_url: str, queue_name: str
) -> None:
    store = store_for(app)
    big = "x" * SIZE
    # Connected beforehand: the connection is not measured.
    relay_for(app).producers.connect()
    with Session(store.engine) as session, store.bind_session(session):  # type: ignore[attr-defined]
        with session.begin():
            for _ in range(ROWS):
                app.tasks[RECORD].delay(big)
            tracemalloc.start()  # the rows are built: measure the commit and its publish
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()

    print(f"\n{ROWS} x {SIZE} bytes in one commit: the publish allocated {peak / MIB:.1f} MiB")
    assert queued_count(redis_url, queue_name) == ROWS
    assert peak < 8 * BUDGET, f"{peak / MIB:.1f} MiB for {ROWS * SIZE / MIB:.0f} MiB of rows"


def test_with_the_broker_down_every_part_is_left_to_the_sweeper(
    postgres_database_url: str, queue_name: str
) -> None:
    create_tables(postgres_database_url)
    down = f"redis://127.0.0.1:{free_port()}/0"
    app = create_app(down, queue_name, postgres_database_url, outbox_sweep_batch_bytes=BUDGET)
    store = store_for(app)
    try:
        engine = store.engine  # type: ignore[attr-defined]
        with Session(engine) as session, store.bind_session(session), session.begin():  # type: ignore[attr-defined]
            for _ in range(ROWS):
                app.tasks[RECORD].delay("x" * SIZE)
        with store.engine.connect() as conn:  # type: ignore[attr-defined]
            rows = conn.execute(select(outbox_table.c.status, outbox_table.c.attempts)).all()
    finally:
        relay_for(app).close()
        store.engine.dispose()  # type: ignore[attr-defined]
        app.close()

    assert sorted(rows) == [("pending", 1)] * ROWS  # none lost, each tried once
