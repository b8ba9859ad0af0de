"""The producer SIGKILLed right after COMMIT, before publishing: the sweeper publishes the rows.

Producer processes, two at a time, commit transactions dispatching tasks; most kill
themselves with SIGKILL in the first after-commit callback of their last transaction
(before the outbox's publish callback), the others are SIGKILLed from outside at a random
moment (before, during or after a commit). A worker with embedded beat runs the tasks and
the sweep. Every dispatch that committed must run; none that rolled back may.
"""

from __future__ import annotations

import random
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import StartWorker
from tests.reliability.app import create_tables, make_engine
from tests.reliability.conftest import RecordResult
from tests.reliability.harness import (
    ScenarioEnv,
    done_tally,
    expected_count,
    expected_keys,
    quiescent,
    settle,
    start_producer,
    swept_rows,
)

pytestmark = pytest.mark.slow

#: Committed dispatches the scenario reaches before it stops producing.
TARGET_TASKS = 1000
#: Every fourth producer is killed from outside instead of killing itself after commit.
EXTERNAL_KILL_EVERY = 4
#: Producers started together (each spends most of its life importing, on a core of its own).
PRODUCERS_AT_ONCE = 2
#: Seconds the worker gets, once nothing is left to publish or queued, to finish its last task.
QUIET_SECONDS = 1.0


def test_producer_sigkilled_after_commit_loses_nothing(
    celery_worker_process: StartWorker,
    amqp_url: str,
    amqp_queue: str,
    postgres_database_url: str,
    make_scenario_env: Callable[..., ScenarioEnv],
    record_result: RecordResult,
    tmp_path: Path,
) -> None:
    env = make_scenario_env(broker=amqp_url, db_url=postgres_database_url)
    engine = make_engine(env.db_url)
    create_tables(engine)
    worker = celery_worker_process(
        "tests.reliability.app",
        queue=env.queue,
        env=env.as_env(),
        pool="prefork",
        concurrency=2,
        extra_args=("-B",),
    )
    rng = random.Random(9)
    self_kills = external_kills = runs = 0
    while expected_count(engine) < TARGET_TASKS:
        started: list[tuple[float | None, subprocess.Popen[bytes]]] = []
        for _ in range(PRODUCERS_AT_ONCE):
            external = runs % EXTERNAL_KILL_EVERY == EXTERNAL_KILL_EVERY - 1
            args = [f"r{runs}", str(rng.randint(1, 8)), "5", "20"]
            kill_after = rng.uniform(0.5, 2.0) if external else None
            producer = start_producer(
                env,
                tmp_path / "producers.log",
                *args,
                *([] if external else ["--die-after-commit"]),
            )
            started.append((kill_after, producer))
            runs += 1
        began = time.monotonic()
        for kill_after, producer in started:
            if kill_after is not None:  # SIGKILLed from outside kill_after s after its start
                try:
                    producer.wait(timeout=max(0.0, began + kill_after - time.monotonic()))
                except subprocess.TimeoutExpired:
                    producer.kill()
                external_kills += producer.wait(timeout=30) == -signal.SIGKILL
            else:
                assert producer.wait(timeout=60) == -signal.SIGKILL, (
                    tmp_path / "producers.log"
                ).read_text()[-3000:]
                self_kills += 1

    expected = expected_keys(engine)
    settle(lambda: not done_tally(env, expected).lost, timeout=120)
    # A lease (5 s) may still be out: wait until no row is pending and the queue is empty,
    # then for the task the worker may be running, so a duplicate it causes shows.
    settle(lambda: quiescent(env, engine), timeout=30)
    time.sleep(QUIET_SECONDS)
    tally = done_tally(env, expected)
    record_result(
        "producer_sigkill_after_commit",
        title="Producer SIGKILLed right after COMMIT, before publishing",
        tasks=tally.tasks,
        lost=len(tally.lost),
        duplicates=tally.duplicates,
        notes=f"{self_kills} self-kills after commit + {external_kills} random external "
        f"SIGKILLs over {runs} producer processes; RabbitMQ, PostgreSQL, SQLAlchemy store",
        extra={"swept": swept_rows(worker.log_text())},
    )
    assert not tally.lost, tally.summary()
    assert not tally.phantoms, f"rolled-back dispatches ran: {tally.summary()}"
    engine.dispose()
