"""PostgreSQL stopped while workers retry and dead-letter, then restarted: nothing lost.

Tasks that fail a few times (``flaky``) and tasks that always fail (``doomed``: a dead
letter after 2 retries) are dispatched; right away the database, a throwaway PostgreSQL,
is shut down (``immediate``: as a crash) for a few seconds. While it is down, retries that
ride on a Celery ETA go on, but parking a retry or writing a dead letter is impossible:
the core rejects the message with requeue instead of dropping it. Once the database is
back, every ``flaky`` task must finish and every ``doomed`` task must have its dead letter.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable

import pytest
from sqlalchemy import Engine, insert, select
from sqlalchemy.orm import Session

from celery_outbox.sqlalchemy import dead_letter_table, outbox_table
from tests.conftest import StartWorker
from tests.reliability.app import DOOMED, FLAKY, create_app, create_tables, expected_table
from tests.reliability.conftest import RecordResult
from tests.reliability.harness import ScenarioEnv, done_tally, settle, swept_rows
from tests.reliability.servers import ThrowawayPostgres

pytestmark = pytest.mark.slow

FLAKY_TASKS, DOOMED_TASKS = 40, 20
#: Seconds the database stays down.
OUTAGE = 6.0


def _dead_letters(engine: Engine) -> Counter[str]:
    with engine.connect() as conn:
        return Counter(
            str(task_id) for task_id in conn.execute(select(dead_letter_table.c.task_id)).scalars()
        )


def _rows_left(engine: Engine) -> list[dict[str, object]]:
    columns = [
        outbox_table.c[name]
        for name in (
            "task_id",
            "status",
            "available_at",
            "locked_until",
            "attempts",
            "last_error",
            "created_at",
        )
    ]
    with engine.connect() as conn:
        return [dict(row._mapping) for row in conn.execute(select(*columns))]


def test_postgres_down_while_workers_retry_and_dead_letter(
    celery_worker_process: StartWorker,
    throwaway_postgres: ThrowawayPostgres,
    amqp_url: str,
    amqp_queue: str,
    make_scenario_env: Callable[..., ScenarioEnv],
    record_result: RecordResult,
) -> None:
    env = make_scenario_env(broker=amqp_url, db_url=throwaway_postgres.url)
    app, store = create_app(
        broker=env.broker, db_url=env.db_url, queue=env.queue, ledger_dir=str(env.ledger_dir)
    )
    create_tables(store.engine)
    # Waits above 0.5 s (the 3rd retry on) are parked in the table, the others ride an ETA.
    worker_env = {**env.as_env(), "RELIABILITY_CONF": json.dumps({"outbox_park_after": 0.5})}
    worker = celery_worker_process(
        "tests.reliability.app",
        queue=env.queue,
        env=worker_env,
        pool="prefork",
        concurrency=2,
        extra_args=("-B",),
    )
    flaky = {f"f{i}": 2 + i % 5 for i in range(FLAKY_TASKS)}  # 2..6 failures each
    doomed = {f"d{i}" for i in range(DOOMED_TASKS)}
    with Session(store.engine) as session, session.begin(), store.bind_session(session):
        session.execute(insert(expected_table), [{"key": k} for k in [*flaky, *doomed]])
        for key, failures in flaky.items():
            app.tasks[FLAKY].apply_async((key, failures), task_id=key)
        for key in doomed:
            app.tasks[DOOMED].apply_async((key,), task_id=key)
    # Stop the database once retries are in full swing: the first dead letter is written.
    settle(lambda: bool(_dead_letters(store.engine)), timeout=30, interval=0.05)
    letters_before = sum(_dead_letters(store.engine).values())
    throwaway_postgres.stop(mode="kill")
    time.sleep(OUTAGE)
    throwaway_postgres.start()

    def finished() -> bool:
        return not done_tally(env, set(flaky)).lost and set(_dead_letters(store.engine)) >= doomed

    settle(finished, timeout=120)
    done = done_tally(env, set(flaky))
    letters = _dead_letters(store.engine)
    lost_letters = doomed - set(letters)
    log = worker.log_text()
    duplicates = done.duplicates + sum(letters.values()) - len(letters)
    record_result(
        "postgres_down_during_retries",
        title="PostgreSQL stopped (immediate shutdown) while workers retry and dead-letter",
        tasks=len(flaky) + len(doomed),
        lost=len(done.lost) + len(lost_letters),
        duplicates=duplicates,
        notes=(
            f"{FLAKY_TASKS} flaky tasks (2-6 failures, ETA and parked retries) and "
            f"{DOOMED_TASKS} dead letters; database down {OUTAGE:.0f} s; RabbitMQ"
        ),
        extra={
            "dead_letters_before_stop": letters_before,
            "dead_letters_after": sum(letters.values()),
            "unexpected_dead_letters": len(set(letters) - doomed),
            "requeued_unwritten_dead_letters": log.count("could not write the dead letter"),
            "requeued_unparked_retries": log.count("could not park retry"),
            "swept": swept_rows(log),
        },
    )
    assert not done.lost, f"{done.summary()}\noutbox rows left: {_rows_left(store.engine)}"
    assert not lost_letters, f"missing dead letters: {sorted(lost_letters)[:5]}"
    assert set(letters) <= doomed, f"flaky tasks dead-lettered: {set(letters) - doomed}"
    store.engine.dispose()
