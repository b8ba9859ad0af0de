"""Rows written straight into the table are decoded only as the app allows (issue 13 #1).

On real PostgreSQL and Redis: a row claiming pickle on a JSON-only app, and a zlib
bomb, reach the sweeper (the relay's ``validate``) and the sweep task. Neither is
decoded or inflated; each ends ``failed`` with a reason, and nothing is published.
"""

from __future__ import annotations

import tracemalloc
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import insert, select

from celery_outbox.clock import utcnow
from celery_outbox.config import OutboxConfig
from celery_outbox.dispatch.envelope import build_message
from celery_outbox.registry import store_for
from celery_outbox.relay.relay import relay_for
from celery_outbox.relay.sweeper import Sweeper
from celery_outbox.sqlalchemy import outbox_table
from celery_outbox.store.records import message_columns
from celery_outbox.sweep_task import SWEEP_TASK
from tests.hostile import BOMB_BYTES, pickle_row, zlib_bomb
from tests.integration.sweep_app import RECORD, create_app, create_tables, insert_committed_rows
from tests.integration.sweep_support import drain_task_ids, queued_count

#: How much a sweep of a bomb may allocate (the bomb inflates to 256 MiB).
ALLOCATION_LIMIT = 32 * 1024 * 1024

HostileRow = Callable[[dict[str, Any]], tuple[str, dict[str, Any]]]


@pytest.fixture
def app(postgres_database_url: str, redis_url: str, queue_name: str) -> Iterator[Celery]:
    create_tables(postgres_database_url)
    app = create_app(redis_url, queue_name, postgres_database_url, outbox_publish_grace=0.0)
    yield app
    relay_for(app).close()
    store_for(app).engine.dispose()  # type: ignore[attr-defined]
    app.close()


def write_row(app: Celery, hostile: HostileRow, task_id: str = "hostile") -> int:
    """Insert a committed pending row of ``RECORD`` whose body ``hostile`` replaces."""
    message = build_message(
        app.tasks[RECORD],
        (1,),
        {},
        task_id=task_id,
        options={},
        now=utcnow(),
        park_after=OutboxConfig.from_celery(app).park_after,
        max_bytes=None,
    )
    values = message_columns(message, created_at=utcnow())
    values["payload"], values["options"] = hostile(dict(message.options))
    with store_for(app).engine.begin() as conn:  # type: ignore[attr-defined]
        return int(conn.execute(insert(outbox_table).values(values)).inserted_primary_key[0])


def row_state(app: Celery, row_id: int) -> tuple[str, str]:
    with store_for(app).engine.connect() as conn:  # type: ignore[attr-defined]
        row = conn.execute(select(outbox_table).where(outbox_table.c.id == row_id)).one()
    return row.status, row.last_error


def sweep(app: Celery) -> Any:
    config = OutboxConfig.from_celery(app)
    return Sweeper(app=app, store=store_for(app), relay=relay_for(app), config=config).sweep()


def sweep_task(app: Celery) -> Any:
    app.finalize()
    return app.tasks[SWEEP_TASK].apply().get()


@pytest.mark.parametrize("run", [sweep, sweep_task], ids=["sweeper", "sweep-task"])
def test_a_pickle_row_on_a_json_app_is_failed_without_being_unpickled(
    app: Celery, tmp_path: Path, queue_name: str, redis_url: str, run: Callable[[Celery], Any]
) -> None:
    marker = tmp_path / "pwned"
    good = insert_committed_rows(app, 20, created_at=utcnow() - timedelta(minutes=1))
    row_id = write_row(app, lambda options: pickle_row(options, marker))

    run(app)

    assert not marker.exists(), "the relay unpickled a row the app does not accept"
    status, reason = row_state(app, row_id)
    assert status == "failed"
    assert "'application/x-python-serialize' is not accepted" in reason
    # The valid rows of the same batch are published, each once; the hostile one is not.
    assert drain_task_ids(redis_url, queue_name) == Counter(dict.fromkeys(good, 1))


@pytest.mark.parametrize("run", [sweep, sweep_task], ids=["sweeper", "sweep-task"])
def test_a_zlib_bomb_is_failed_without_being_inflated(
    app: Celery, queue_name: str, redis_url: str, run: Callable[[Celery], Any]
) -> None:
    row_id = write_row(app, zlib_bomb)

    tracemalloc.start()
    try:
        run(app)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    print(f"\nsweep of a {BOMB_BYTES >> 20} MiB zlib bomb: {peak / 2**20:.1f} MiB allocated")
    assert peak < ALLOCATION_LIMIT, f"the sweep allocated {peak} bytes for a {BOMB_BYTES} bomb"
    status, reason = row_state(app, row_id)
    assert status == "failed"
    assert "inflates beyond outbox_max_payload_bytes=4194304" in reason
    assert queued_count(redis_url, queue_name) == 0


def test_an_accepted_compressed_row_within_the_limit_is_published(
    app: Celery, queue_name: str, redis_url: str
) -> None:
    row_id = write_row(app, lambda options: zlib_bomb(options, size=1024 * 1024))

    assert sweep(app).published == 1
    assert queued_count(redis_url, queue_name) == 1
    with store_for(app).engine.connect() as conn:  # type: ignore[attr-defined]
        assert conn.execute(select(outbox_table).where(outbox_table.c.id == row_id)).first() is None
