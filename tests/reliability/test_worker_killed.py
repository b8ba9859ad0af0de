"""A worker SIGKILLed mid-task: the task is redelivered and completes.

``OutboxTask`` is ``acks_late`` and ``reject_on_worker_lost``. Two ways to die:

- ``pool-child``: the prefork child running a task is SIGKILLed (the OOM killer's way);
  the worker's main process rejects the message with requeue, and it runs again;
- ``whole-worker``: the worker and its children are SIGKILLed together; RabbitMQ
  requeues the unacknowledged messages when the connection drops, and a new worker runs
  them.

Counted from the tasks' own ledger: every task must finish (``done``), whatever number
of attempts were killed on the way.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Literal

import pytest
from sqlalchemy import insert
from sqlalchemy.orm import Session

from tests.conftest import StartWorker
from tests.reliability import ledger
from tests.reliability.app import SLOW, create_app, create_tables, expected_table
from tests.reliability.conftest import RecordResult
from tests.reliability.harness import ScenarioEnv, done_tally, settle
from tests.worker import WorkerProcess

pytestmark = pytest.mark.slow

TASKS = 8
#: Seconds each task sleeps: long enough to be killed in the middle.
TASK_SECONDS = 1.0
#: Pool children killed mid-task in the ``pool-child`` variant.
CHILD_KILLS = 3

Death = Literal["pool-child", "whole-worker"]


def _running(env: ScenarioEnv, skip: set[str]) -> tuple[str, int] | None:
    """A task started but not finished (key, pid of its process), not in ``skip``."""
    done = ledger.events(env.ledger_dir, ledger.DONE)
    for key, pid in ledger.records(env.ledger_dir, ledger.STARTED):
        if key not in done and key not in skip:
            return key, pid
    return None


def _kill_pool_children(worker: WorkerProcess, env: ScenarioEnv) -> int:
    killed: set[str] = set()
    for _ in range(CHILD_KILLS):
        settle(lambda: _running(env, killed) is not None, timeout=30, interval=0.05)
        found = _running(env, killed)
        if found is None:
            break
        key, pid = found
        # Only a process of the worker's own group: never anything we did not start.
        if pid in worker.group_pids() and pid != worker.pid:
            time.sleep(0.2)  # well inside the task's sleep
            os.kill(pid, signal.SIGKILL)
            killed.add(key)
    return len(killed)


@pytest.mark.parametrize("death", ["pool-child", "whole-worker"])
def test_worker_sigkilled_mid_task_redelivers_and_completes(
    death: Death,
    celery_worker_process: StartWorker,
    amqp_url: str,
    amqp_queue: str,
    postgres_database_url: str,
    make_scenario_env: Callable[..., ScenarioEnv],
    record_result: RecordResult,
) -> None:
    env = make_scenario_env(broker=amqp_url, db_url=postgres_database_url)
    app, store = create_app(
        broker=env.broker, db_url=env.db_url, queue=env.queue, ledger_dir=str(env.ledger_dir)
    )
    create_tables(store.engine)

    def start() -> WorkerProcess:
        return celery_worker_process(
            "tests.reliability.app",
            queue=env.queue,
            env=env.as_env(),
            pool="prefork",
            concurrency=2,
        )

    worker = start()
    keys = {f"s{i}" for i in range(TASKS)}
    with Session(store.engine) as session, session.begin(), store.bind_session(session):
        session.execute(insert(expected_table), [{"key": k} for k in sorted(keys)])
        for key in sorted(keys):
            app.tasks[SLOW].apply_async((key, TASK_SECONDS), task_id=key)

    if death == "pool-child":
        kills = _kill_pool_children(worker, env)
    else:
        settle(
            lambda: len(ledger.events(env.ledger_dir, ledger.STARTED)) >= 2,
            timeout=30,
            interval=0.05,
        )
        time.sleep(0.2)
        worker.kill()
        kills = sum(
            1
            for key in ledger.events(env.ledger_dir, ledger.STARTED)
            if key not in ledger.events(env.ledger_dir, ledger.DONE)
        )
        worker = start()

    settle(lambda: not done_tally(env, keys).lost, timeout=90)
    tally = done_tally(env, keys)
    started = ledger.events(env.ledger_dir, ledger.STARTED)
    record_result(
        f"worker_sigkill_{death.replace('-', '_')}",
        title=(
            "Worker pool child SIGKILLed mid-task"
            if death == "pool-child"
            else "Whole worker (main process and children) SIGKILLed mid-task"
        ),
        tasks=tally.tasks,
        lost=len(tally.lost),
        duplicates=tally.duplicates,
        notes=f"{kills} task attempts killed mid-task; prefork x2, RabbitMQ, acks_late",
        extra={"attempts": sum(started.values())},
    )
    assert kills >= 1, "no task was killed mid-task: the scenario did not happen"
    assert not tally.lost, f"{tally.summary()}\n{worker.log_text()[-4000:]}"
    store.engine.dispose()
