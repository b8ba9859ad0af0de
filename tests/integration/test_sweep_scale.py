"""The sweeper at scale on PostgreSQL: concurrent sweepers, and a large kept history."""

from __future__ import annotations

import json
import statistics
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import event, text

from celery_outbox.clock import utcnow
from celery_outbox.config import OutboxConfig
from celery_outbox.registry import store_for
from celery_outbox.relay.relay import relay_for
from celery_outbox.relay.sweeper import Sweeper, SweepReport
from celery_outbox.store.records import MessageStatus
from tests.integration.sweep_app import (
    conf_env,
    create_app,
    create_tables,
    insert_committed_rows,
)
from tests.integration.sweep_support import drain_task_ids
from tests.integration.test_sweep import LONG_AGO, start_sweeper_process

pytestmark = pytest.mark.slow

SWEEPERS = 4
ROWS = 10_000  # 20 batches of 500 for four racing sweepers
KEPT_ROWS = 1_000_000


@pytest.fixture
def outbox_db(postgres_database_url: str) -> str:
    create_tables(postgres_database_url)
    return postgres_database_url


@pytest.fixture
def app_factory() -> Iterator[Any]:
    apps: list[Celery] = []

    def make(*args: Any, **conf: Any) -> Celery:
        apps.append(create_app(*args, **conf))
        return apps[-1]

    yield make
    for app in apps:
        relay_for(app).close()
        store_for(app).engine.dispose()  # type: ignore[attr-defined]
        app.close()


def test_four_sweepers_at_once_publish_each_row_exactly_once(
    app_factory: Any, broker_url: str, broker_queue: str, outbox_db: str, tmp_path: Path
) -> None:
    app = app_factory(broker_url, broker_queue, outbox_db)
    task_ids = insert_committed_rows(app, ROWS, created_at=utcnow() - LONG_AGO)
    go = tmp_path / "go"
    env = {
        "OUTBOX_TEST_BROKER": broker_url,
        "OUTBOX_TEST_QUEUE": broker_queue,
        "OUTBOX_TEST_DB": outbox_db,
        # The race of the claims is under test, not a stalled broker: on a loaded machine
        # a pipeline of 500 can wait longer than the default second, and a pass that times
        # out reschedules its rows (delivered or not), which this count would read as lost.
        "OUTBOX_TEST_CONF": conf_env({"outbox_publish_timeout": 30.0}),
    }
    sweepers = [start_sweeper_process(env, "--go", str(go)) for _ in range(SWEEPERS)]
    for process in sweepers:  # all four imported and set up before they race
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "ready"
    started = time.monotonic()
    go.touch()
    reports = [_report_of(process) for process in sweepers]
    elapsed = time.monotonic() - started

    seen = drain_task_ids(broker_url, broker_queue)  # every sweeper exited: all are queued
    shares = [r["published"] for r in reports]
    print(
        f"\n{SWEEPERS} sweepers, {ROWS} rows in {elapsed:.1f} s: published {shares} "
        f"(sum {sum(shares)}); broker holds {sum(seen.values())} messages, "
        f"{len(seen)} distinct task ids"
    )
    assert sum(shares) == ROWS
    assert sum(seen.values()) == ROWS
    assert seen == Counter(dict.fromkeys(task_ids, 1))
    assert store_for(app).count_by_status()[MessageStatus.PENDING] == 0


def _report_of(process: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = process.communicate(timeout=600)
    assert process.returncode == 0, out
    report: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return report


def test_an_empty_sweep_over_a_million_kept_rows_uses_an_index(
    app_factory: Any, memory_broker_url: str, queue_name: str, outbox_db: str
) -> None:
    app = app_factory(memory_broker_url, queue_name, outbox_db)
    engine = store_for(app).engine  # type: ignore[attr-defined]
    with engine.begin() as conn:
        conn.execute(text(KEEP_MILLION))
        conn.execute(text("ANALYZE celery_outbox_message"))
    sweeper = Sweeper(
        app=app, store=store_for(app), relay=relay_for(app), config=OutboxConfig.from_celery(app)
    )

    seen = _statements_of(engine, sweeper.sweep)
    # The first sweep also reads and writes the sweep record (one row, its own table).
    # It reads the database's clock too (once per 30 s: celery_outbox.clock).
    clock = [s for s in seen if s[0].startswith("SELECT now()")]
    statements = [s for s in seen if "celery_outbox_sweep" not in s[0] and s not in clock]
    assert len(seen) - len(statements) - len(clock) <= 2
    timings = _timings(sweeper.sweep, runs=30)
    plan = _explain(engine, *statements[0])

    print(
        f"\nempty sweep over {KEPT_ROWS} kept rows: median {statistics.median(timings):.2f} ms,"
        f" max {max(timings):.2f} ms\n{statements[0][0]}\n" + "\n".join(plan)
    )
    assert len(statements) == 1, "an empty sweep is one claim statement"
    assert not any("Seq Scan" in line for line in plan)
    # The planner picks the partial pending index or the (status, available_at) one.
    assert any("Index Scan" in line or "Index Only Scan" in line for line in plan)
    assert statistics.median(timings) < 50.0


KEEP_MILLION = f"""
INSERT INTO celery_outbox_message (task_id, task_name, payload, options, status,
    available_at, attempts, last_error, locked_until, created_at, published_at)
SELECT 'kept-' || g, 'sweep_it.record', '[[1], {{}}, {{}}]', '{{}}'::jsonb, 'published',
    now() - interval '1 day', 1, '', NULL, now() - interval '1 day', now() - interval '1 day'
FROM generate_series(1, {KEPT_ROWS}) AS g
"""


def _statements_of(engine: Any, work: Any) -> list[tuple[str, Any]]:
    seen: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        seen.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", record)
    try:
        assert work() == SweepReport()
    finally:
        event.remove(engine, "before_cursor_execute", record)
    return seen


def _timings(work: Any, *, runs: int) -> list[float]:
    timings = []
    for _ in range(runs):
        started = time.perf_counter()
        work()
        timings.append((time.perf_counter() - started) * 1000)
    return timings


def _explain(engine: Any, statement: str, parameters: Any) -> list[str]:
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        cursor.execute("EXPLAIN " + statement, parameters)
        plan = [row[0] for row in cursor.fetchall()]
        raw.rollback()
        return plan
    finally:
        raw.close()
