"""The sweeper against real PostgreSQL, real brokers and a real worker.

Rows are written as a crash after COMMIT leaves them: committed, never published.
Every test counts task ids in the broker (or runs in the worker), never rows.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from sqlalchemy.orm import Session

from celery_outbox.clock import utcnow
from celery_outbox.config import OutboxConfig
from celery_outbox.registry import store_for
from celery_outbox.relay.relay import relay_for
from celery_outbox.relay.sweeper import Sweeper, SweepReport
from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore
from celery_outbox.store.records import MessageStatus
from tests.conftest import StartWorker
from tests.integration.sweep_app import (
    RECORD,
    conf_env,
    create_app,
    create_tables,
    insert_committed_rows,
)
from tests.integration.sweep_support import (
    ThrowawayRedis,
    drain_task_ids,
    queued_count,
    run_lines,
)
from tests.messages import numbered
from tests.worker import REPO_ROOT, wait_for, worker_env

LONG_AGO = timedelta(hours=1)


@pytest.fixture
def outbox_db(postgres_database_url: str) -> str:
    """A fresh PostgreSQL database with the outbox tables."""
    create_tables(postgres_database_url)
    return postgres_database_url


@pytest.fixture
def make_app() -> Iterator[Any]:
    apps: list[Celery] = []

    def make(broker_url: str, queue: str, db_url: str, **conf: Any) -> Celery:
        apps.append(create_app(broker_url, queue, db_url, **conf))
        return apps[-1]

    yield make
    for app in apps:
        relay_for(app).close()
        store_for(app).engine.dispose()  # type: ignore[attr-defined]
        app.close()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[ThrowawayRedis]:
    server = ThrowawayRedis(tmp_path)
    server.start()
    yield server
    server.stop()


def sweeper_for(app: Celery) -> Sweeper:
    return Sweeper(
        app=app, store=store_for(app), relay=relay_for(app), config=OutboxConfig.from_celery(app)
    )


def counts(app: Celery) -> dict[str, int]:
    return {s.value: n for s, n in store_for(app).count_by_status().items()}


EMPTY = {"pending": 0, "published": 0, "failed": 0}


def test_rows_left_by_a_crash_after_commit_are_published_by_one_sweep(
    make_app: Any,
    broker_url: str,
    broker_queue: str,
    outbox_db: str,
    tmp_path: Path,
    celery_worker_process: StartWorker,
) -> None:
    app = make_app(broker_url, broker_queue, outbox_db, outbox_publish_grace=0.2)
    store: SQLAlchemyOutboxStore = store_for(app)  # type: ignore[assignment]
    task_ids = [f"crash-{n}" for n in range(40)]
    with Session(store.engine) as session, session.begin(), store.bind_session(session):
        for n, task_id in enumerate(task_ids):  # store.add only: no on-commit publish
            store.add(numbered(app.tasks[RECORD], n, task_id=task_id, now=utcnow()))
    assert counts(app)["pending"] == 40
    time.sleep(0.3)  # past the grace: the rows are the sweeper's now

    assert sweeper_for(app).sweep() == SweepReport(published=40, batches=1)
    assert counts(app) == EMPTY

    output = tmp_path / "runs.txt"
    env = {
        "OUTBOX_TEST_BROKER": broker_url,
        "OUTBOX_TEST_QUEUE": broker_queue,
        "OUTBOX_TEST_DB": outbox_db,
        "OUTBOX_TEST_OUTPUT": str(output),
    }
    celery_worker_process("tests.integration.sweep_app", queue=broker_queue, env=env)
    wait_for(lambda: sum(run_lines(output).values()) >= 40, timeout=60, what="40 runs")
    time.sleep(1.0)  # room for a duplicate to show up
    assert run_lines(output) == Counter(dict.fromkeys(task_ids, 1))


def test_a_sweep_reuses_one_broker_connection_across_batches(
    make_app: Any, redis_server: ThrowawayRedis, queue_name: str, outbox_db: str
) -> None:
    app = make_app(redis_server.url, queue_name, outbox_db, outbox_sweep_batch_size=100)
    task_ids = insert_committed_rows(app, 600, created_at=utcnow() - LONG_AGO)
    before = redis_server.connections_received()

    report = sweeper_for(app).sweep()

    opened = redis_server.connections_received() - before
    print(f"\n600 rows in {report.batches} batches: the broker accepted {opened} connection(s)")
    assert report == SweepReport(published=600, batches=6)
    # kombu's Redis transport opens a fixed few sockets for one Connection (3 here),
    # however many batches and messages go through it.
    assert opened <= 3, f"{opened} connections for 600 messages in 6 batches"
    assert drain_task_ids(redis_server.url, queue_name) == Counter(dict.fromkeys(task_ids, 1))


def test_a_backlog_sweep_claims_its_next_batches_on_a_thread(
    make_app: Any,
    redis_server: ThrowawayRedis,
    queue_name: str,
    outbox_db: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = make_app(redis_server.url, queue_name, outbox_db, outbox_sweep_batch_size=100)
    task_ids = insert_committed_rows(app, 350, created_at=utcnow() - LONG_AGO)
    threads: list[str] = []
    claim_due = SQLAlchemyOutboxStore.claim_due

    def recording(self: SQLAlchemyOutboxStore, **kwargs: Any) -> Any:
        threads.append(threading.current_thread().name)
        return claim_due(self, **kwargs)

    monkeypatch.setattr(SQLAlchemyOutboxStore, "claim_due", recording)

    assert sweeper_for(app).sweep() == SweepReport(published=350, batches=4)

    assert threads[0] == threading.current_thread().name
    assert len(threads) == 4
    assert all(name.startswith("celery-outbox-claim") for name in threads[1:]), threads
    assert counts(app) == EMPTY
    assert drain_task_ids(redis_server.url, queue_name) == Counter(dict.fromkeys(task_ids, 1))


def test_broker_down_sweeps_back_off_and_broker_back_publishes_everything(
    make_app: Any, redis_server: ThrowawayRedis, queue_name: str, outbox_db: str
) -> None:
    app = make_app(
        redis_server.url,
        queue_name,
        outbox_db,
        outbox_sweep_batch_size=100,
        outbox_publish_timeout=0.5,
    )
    task_ids = insert_committed_rows(app, 250, created_at=utcnow() - LONG_AGO)
    sweeper = sweeper_for(app)
    redis_server.stop()

    down = [sweeper.sweep() for _ in range(4)]  # one batch each: the broker is down

    assert sum(r.rescheduled for r in down) == 250
    assert sum(r.published for r in down) == 0
    rows = pending_rows(app)
    assert {(r["attempts"], r["locked_until"]) for r in rows} == {(1, None)}
    assert min(r["available_at"] for r in rows) > utcnow()  # backing off
    assert all(r["last_error"] for r in rows)
    assert sweeper.sweep() == SweepReport()  # nothing due yet: no hammering

    redis_server.start()
    published = 0
    deadline = time.monotonic() + 30
    while counts(app)["pending"] and time.monotonic() < deadline:
        published += sweeper.sweep().published
        time.sleep(0.2)
    assert published == 250
    assert counts(app) == EMPTY
    assert drain_task_ids(redis_server.url, queue_name) == Counter(dict.fromkeys(task_ids, 1))


def pending_rows(app: Celery) -> list[dict[str, Any]]:
    from sqlalchemy import select

    from celery_outbox.sqlalchemy import outbox_table

    with store_for(app).engine.connect() as conn:  # type: ignore[attr-defined]
        rows = conn.execute(select(outbox_table)).mappings().all()
    return [dict(r) for r in rows if r["status"] == MessageStatus.PENDING.value]


def start_sweeper_process(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.integration.sweep_process", *args],
        cwd=REPO_ROOT,
        env=worker_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def test_a_sweeper_killed_mid_batch_leaves_its_rows_to_another_after_the_lease(
    make_app: Any, broker_url: str, broker_queue: str, outbox_db: str
) -> None:
    lease = 6.0  # long enough for a loaded machine to get the first messages out
    conf = {"outbox_claim_lease": lease, "outbox_sweep_batch_size": 200}
    app = make_app(broker_url, broker_queue, outbox_db, **conf)
    task_ids = insert_committed_rows(app, 200, created_at=utcnow() - LONG_AGO)
    env = {
        "OUTBOX_TEST_BROKER": broker_url,
        "OUTBOX_TEST_QUEUE": broker_queue,
        "OUTBOX_TEST_DB": outbox_db,
        "OUTBOX_TEST_CONF": conf_env(conf),
    }
    victim = start_sweeper_process(env, "--publish-delay", "0.05")
    try:
        assert victim.stdout is not None
        assert victim.stdout.readline().strip() == "claimed 200"
        claimed_at = time.monotonic()
        wait_for(
            lambda: queued_count(broker_url, broker_queue) >= 3,
            timeout=lease / 2,
            what="the first messages of the batch",
        )  # then 195 or so to go
    finally:
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(timeout=10)
        victim.stdout.close()  # type: ignore[union-attr]

    sweeper = sweeper_for(app)
    assert sweeper.sweep() == SweepReport()  # still leased to the dead sweeper
    assert time.monotonic() - claimed_at < lease
    # The lease ends at the dead sweeper's claim time + lease, before now + lease: a sweeper
    # whose clock reads that takes the rows (the store compares with the sweeper's clock),
    # without waiting the lease out.
    after_lease = Sweeper(
        app=app,
        store=store_for(app),
        relay=relay_for(app),
        config=OutboxConfig.from_celery(app),
        clock=lambda: utcnow() + timedelta(seconds=lease),
    )
    assert after_lease.sweep() == SweepReport(published=200, batches=1)

    seen = drain_task_ids(broker_url, broker_queue)
    twice = sorted(t for t, n in seen.items() if n == 2)
    print(f"\nkilled mid-batch: {len(twice)} of 200 published before the kill, again after")
    assert set(seen) == set(task_ids), "none lost"
    assert max(seen.values()) <= 2
    assert 0 < len(twice) < 200
    assert counts(app) == EMPTY
