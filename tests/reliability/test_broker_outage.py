"""The broker stopped (or frozen) during a stream of commits, then back: none lost, none hung.

The test process commits a stream of transactions, each dispatching a few tasks through
the outbox, and times every commit (the on-commit publish included). Meanwhile the broker,
a throwaway Redis, is stopped and started again (``stop``: a SIGKILL, connections refused)
or frozen and thawed (``freeze``: SIGSTOP, the port accepts connections and then nothing
answers, the worst case for a request). A worker with embedded beat runs the tasks and the
sweep throughout. Every committed dispatch must run, and no commit may take long.

The worker is supervised (:class:`~tests.reliability.harness.Supervisor`): Celery's worker
on kombu's Redis transport sometimes dies ("'NoneType' object has no attribute
'hostname'") or stops consuming after "Couldn't ack ... ConnectionError" when Redis goes
away; it is restarted as a process manager would, and the restarts are reported.

Every lost key is attributed from the broker's own durable record, its append-only file
(:mod:`tests.reliability.attribution`): a message the broker never accepted was lost by
the outbox, and fails the test; one the broker accepted and handed out by the last pop it
logged before the SIGKILL, never given back and never run, was lost in kombu's Redis
consumer window (celery/kombu#305, #1733), past the broker: it is reported, at most
``MAX_LOST_PAST_BROKER_PER_KILL`` per kill. Any other loss fails the test.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Literal

import pytest
from celery import Task
from sqlalchemy import insert
from sqlalchemy.orm import Session

from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore
from tests.conftest import StartWorker
from tests.reliability import aof
from tests.reliability.app import RECORD, create_app, create_tables, expected_table
from tests.reliability.attribution import Attribution, attribute
from tests.reliability.conftest import RecordResult
from tests.reliability.harness import (
    ScenarioEnv,
    Supervisor,
    done_tally,
    expected_keys,
    settle,
)
from tests.reliability.servers import ThrowawayRedis

pytestmark = pytest.mark.slow

#: Seconds of committing before, during and after the outage.
BEFORE, OUTAGE, AFTER = 2.0, 5.0, 3.0
#: Tasks per transaction.
BATCH = 5
#: The longest a commit may take while the broker is down or hung: one publish that times
#: out and one reconnection that times out (outbox_publish_timeout = 1 s each), plus slack.
MAX_COMMIT_SECONDS = 2.5
#: Messages a kill may take with it past the broker: the worker has one consuming
#: connection, so at most one BRPOP reply is in flight when Redis dies.
MAX_LOST_PAST_BROKER_PER_KILL = 1

#: Seconds of settling before the only keys missing may be taken as lost in kombu's window.
PAST_BROKER_SETTLE = 20.0

Outage = Literal["stop", "freeze"]


def _break_broker(
    broker: ThrowawayRedis, outage: Outage, done: threading.Event, kills: list[int]
) -> None:
    time.sleep(BEFORE)
    if outage == "stop":
        broker.stop(mode="kill")
        kills.append(len(aof.read_commands(broker.aof_dir)))  # what it logged before dying
    else:
        broker.freeze()
    time.sleep(OUTAGE)
    if outage == "stop":
        broker.start()
    else:
        broker.thaw()
    time.sleep(AFTER)
    done.set()


@pytest.mark.parametrize("outage", ["stop", "freeze"])
def test_broker_outage_during_commits_loses_nothing_and_never_hangs(
    outage: Outage,
    celery_worker_process: StartWorker,
    throwaway_redis: ThrowawayRedis,
    postgres_database_url: str,
    make_scenario_env: Callable[..., ScenarioEnv],
    record_result: RecordResult,
) -> None:
    env = make_scenario_env(broker=throwaway_redis.url, db_url=postgres_database_url)
    app, store = create_app(
        broker=env.broker, db_url=env.db_url, queue=env.queue, ledger_dir=str(env.ledger_dir)
    )
    create_tables(store.engine)
    supervisor = Supervisor(
        lambda: celery_worker_process(
            "tests.reliability.app",
            queue=env.queue,
            env=env.as_env(),
            pool="prefork",
            concurrency=2,
            extra_args=("-B",),
        )
    )
    done = threading.Event()
    kills: list[int] = []
    chaos = threading.Thread(target=_break_broker, args=(throwaway_redis, outage, done, kills))
    chaos.start()
    latencies: list[float] = []
    try:
        while not done.is_set():
            latencies.append(_commit_batch(app.tasks[RECORD], store, len(latencies)))
            time.sleep(0.02)
    finally:
        chaos.join()

    expected = expected_keys(store.engine)

    def blame_for(lost: frozenset[str]) -> Attribution:
        ops = aof.replay(aof.read_commands(throwaway_redis.aof_dir))
        return attribute(lost, ops, queue=env.queue, kills=kills)

    settling = time.monotonic()
    last_look = [settling]

    def all_ran() -> bool:
        tally = done_tally(env, expected)
        supervisor.check(sum(tally.seen.values()))
        if not tally.lost:
            return True
        # A message popped in kombu's window at the kill is gone for good: once the only keys
        # missing are those, waiting the full timeout for them cannot change the outcome.
        now = time.monotonic()
        if now - settling < PAST_BROKER_SETTLE or now - last_look[0] < 2.0:
            return False
        last_look[0] = now
        return blame_for(frozenset(tally.lost)).past_broker == tally.lost

    settle(all_ran, timeout=120)
    tally = done_tally(env, expected)
    blame = blame_for(frozenset(tally.lost))
    worst = max(latencies)
    record_result(
        f"broker_{outage}_during_commits",
        title=(
            "Broker (Redis) SIGKILLed during a stream of commits, then restarted"
            if outage == "stop"
            else "Broker (Redis) frozen (SIGSTOP) during a stream of commits, then thawed"
        ),
        tasks=tally.tasks,
        lost=len(tally.lost),
        duplicates=tally.duplicates,
        notes=f"{len(latencies)} commits; {OUTAGE:.0f} s outage; worker -B throughout",
        extra={
            "max_commit_s": round(worst, 3),
            "worker_restarts": supervisor.restarts,
            "p50_commit_s": round(sorted(latencies)[len(latencies) // 2], 3),
            "lost_by_outbox": len(blame.by_outbox),
            "lost_past_broker": len(blame.past_broker),
            "lost_unexplained": len(blame.unexplained),
            "lost_history": blame.history,
            "broker_killed_after_aof_commands": kills,
        },
    )
    assert not blame.by_outbox, f"never accepted by the broker: {_why(blame, tally.summary())}"
    assert not blame.unexplained, f"lost, not in kombu's window: {_why(blame, tally.summary())}"
    allowed = MAX_LOST_PAST_BROKER_PER_KILL * len(kills)
    assert len(blame.past_broker) <= allowed, f"over {allowed}: {_why(blame, tally.summary())}"
    assert worst < MAX_COMMIT_SECONDS, f"a commit took {worst:.2f}s with the broker {outage}"
    store.engine.dispose()


def _why(blame: Attribution, summary: str) -> str:
    return f"{summary}; " + "; ".join(f"{key} {how}" for key, how in blame.history.items())


def _commit_batch(task: Task[Any, Any], store: SQLAlchemyOutboxStore, number: int) -> float:
    keys = [f"c{number}-{i}" for i in range(BATCH)]
    started = time.monotonic()
    with Session(store.engine) as session, session.begin(), store.bind_session(session):
        session.execute(insert(expected_table), [{"key": key} for key in keys])
        for key in keys:
            task.apply_async((key,), task_id=key)
    return time.monotonic() - started
