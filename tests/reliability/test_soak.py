"""The chaos soak: ten minutes of mixed load while everything is killed at random.

On a throwaway Redis and a throwaway PostgreSQL of the test's own, two prefork workers
(2 children each) of :mod:`tests.reliability.soak_app` and a sweeper process run the
soak's load (:mod:`tests.reliability.soak_load`), a round a second: ``record`` tasks run
now and with a countdown, ``flaky`` tasks retrying on ETAs and parked retries, atomic
tasks each adding one to a counter and dispatching an atomic follow-up, and chains and
chords of atomic workflow steps, all dispatched in transactions; beside each, a
transaction dispatching a ``record`` and an atomic task rolls back. Meanwhile
(:mod:`tests.reliability.soak_chaos`) pool children and whole workers are SIGKILLed,
the sweeper is SIGKILLed and started again, Redis and PostgreSQL are stopped for a few
seconds (clean or crash), and one published row in five is made pending again, all at
random (the seed is recorded). Then everything is brought back and drained
(:mod:`tests.reliability.soak_tally`).

Asserted: nothing committed is lost (messages lost past the broker in kombu's ``BRPOP``
window are republished, counted, and bounded by one per worker per broker stop), nothing
rolled back ran, atomic effects exactly once (the counter equals the atomic dispatches,
no effect row twice, no workflow step twice, every chord body with its header's values),
every workflow ``succeeded``. Duplicates of the non-atomic tasks are allowed and counted.

It runs only with ``OUTBOX_SOAK=1`` (CI's soak step sets it), for
``OUTBOX_SOAK_SECONDS`` seconds (600 by default) of load; the seed is drawn anew each run
unless ``OUTBOX_SOAK_SEED`` is set.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable

import pytest

from tests.conftest import StartWorker
from tests.reliability import ledger
from tests.reliability.chaos import REPUBLISH_ONE_IN, Chaos
from tests.reliability.conftest import RecordResult
from tests.reliability.harness import ScenarioEnv, Supervisor, pending_rows
from tests.reliability.servers import ThrowawayPostgres, ThrowawayRedis
from tests.reliability.soak_app import create_soak_app, create_soak_tables, soak_seconds
from tests.reliability.soak_chaos import STALL_AFTER, WEIGHTS, SoakChaos, SweeperProcess
from tests.reliability.soak_load import Load
from tests.reliability.soak_tally import count, describe, drain
from tests.reliability.workflow_chaos import backlog
from tests.reliability.workflow_chaos_app import SKIPPED
from tests.worker import WorkerProcess

SECONDS = soak_seconds()
#: Seconds between two rounds of load; mean seconds between two disturbances.
ROUND_EVERY, CHAOS_EVERY = 1.0, 3.0
#: Workers (each prefork, 2 children).
WORKERS = ("w1", "w2")
#: Longest drain after the chaos.
DRAIN_TIMEOUT = 300.0

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(SECONDS + DRAIN_TIMEOUT + 300),
    pytest.mark.skipif(
        os.environ.get("OUTBOX_SOAK") != "1",
        reason="the chaos soak runs with OUTBOX_SOAK=1 (OUTBOX_SOAK_SECONDS, default 600)",
    ),
]


def test_soak_mixed_load_under_random_kills_and_outages(
    throwaway_redis: ThrowawayRedis,
    throwaway_postgres: ThrowawayPostgres,
    make_scenario_env: Callable[..., ScenarioEnv],
    record_result: RecordResult,
    celery_worker_process: StartWorker,  # last: its workers stop before the servers
) -> None:
    seed = int(os.environ.get("OUTBOX_SOAK_SEED") or random.SystemRandom().randrange(2**32))
    rng = random.Random(seed)
    env = make_scenario_env(broker=throwaway_redis.url, db_url=throwaway_postgres.url)
    app, store = create_soak_app(
        broker=env.broker, db_url=env.db_url, queue=env.queue, ledger_dir=str(env.ledger_dir)
    )
    engine = store.engine
    create_soak_tables(engine)
    started_workers: list[WorkerProcess] = []

    def start_worker() -> WorkerProcess:
        worker = celery_worker_process(
            "tests.reliability.soak_app",
            queue=env.queue,
            env=env.as_env(),
            pool="prefork",
            concurrency=2,
        )
        started_workers.append(worker)
        return worker

    workers = {name: Supervisor(start_worker, stall_after=STALL_AFTER) for name in WORKERS}
    sweeper = SweeperProcess(env, env.ledger_dir.parent / "sweeper.log")
    sweeper.start()
    chaos = SoakChaos(
        rng=rng,
        every=CHAOS_EVERY,
        redis=throwaway_redis,
        postgres=throwaway_postgres,
        workers=workers,
        sweeper=sweeper,
        republisher=Chaos(app, store, workers[WORKERS[0]].worker),
        work_left=lambda: pending_rows(engine) > 0 or backlog(env.broker, env.queue) > 0,
    )
    load = Load(app, store, random.Random(seed + 1))
    stop = threading.Event()
    loading = threading.Thread(target=load.run, args=(stop,), kwargs={"every": ROUND_EVERY})
    try:
        started = time.monotonic()
        loading.start()
        while time.monotonic() - started < SECONDS and loading.is_alive():
            chaos.step()
            time.sleep(0.2)
        stop.set()
        loading.join(timeout=60)
        chaos_seconds = time.monotonic() - started
        drained = drain(chaos, engine, env, timeout=DRAIN_TIMEOUT)
        found = count(engine, env)
    finally:
        stop.set()
        sweeper.kill()
    if load.error is not None:
        raise load.error
    skipped = sum(ledger.events(env.ledger_dir, SKIPPED).values())
    redis_stops = chaos.done["redis"]
    record_result(
        "chaos_soak",
        title=(
            f"Chaos soak: {chaos_seconds:.0f} s of mixed load (transactions, rollbacks, "
            "ETA and parked retries, atomic tasks, chains and chords) while pool children, "
            "workers, the sweeper, Redis and PostgreSQL are killed at random"
        ),
        tasks=found.tasks,
        lost=found.lost,
        duplicates=found.plain.duplicates + found.atomic_duplicates,
        notes=(
            f"a disturbance every {CHAOS_EVERY:.0f} s on average; 1 in {REPUBLISH_ONE_IN} "
            "published rows republished; duplicates are of the non-atomic tasks (atomic "
            "effects: atomic_effect_duplicates); prefork 2x2, throwaway Redis and PostgreSQL"
        ),
        extra={
            **describe(found),
            "seed": seed,
            **{f"killed_{name}": chaos.done[name] for name in ("child", "worker", "sweeper")},
            "redis_stops": redis_stops,
            "postgres_stops": chaos.done["postgres"],
            "worker_restarts": chaos.worker_restarts(),
            "worker_start_failures": chaos.start_failures,
            "sweeper_restarts_unplanned": chaos.done["sweeper_restarts_unplanned"],
            "tasks_killed": sum(w.log_text().count("WorkerLostError(") for w in started_workers),
            "rolled_back_dispatches": load.rolled_back,
            "failed_transactions": load.failed_transactions,
            "republished_rows": chaos.republisher.republished,
            "duplicates_skipped": skipped,
            "lost_past_broker": drained.lost_past_broker,
            "drain_seconds": round(drained.seconds, 1),
            "seconds": round(chaos_seconds, 1),
        },
    )

    assert set(chaos.done) >= set(WEIGHTS), f"a disturbance never happened: {chaos.done}"
    assert all(found.committed[kind] for kind in ("record", "flaky", "atomic", "workflow"))
    assert not found.dead_letters, f"dead letters: {found.dead_letters}"
    assert not drained.timed_out, f"not drained in {DRAIN_TIMEOUT} s: {found.summary()}"
    assert found.lost == 0, found.summary()
    assert not found.plain.phantoms, f"rolled-back tasks ran: {sorted(found.plain.phantoms)[:5]}"
    assert not found.atomic_phantoms, "a rolled-back atomic task ran"
    assert found.atomic_duplicates == 0, found.summary()
    assert found.atomic_counter == found.committed["atomic"], found.summary()
    assert found.workflows_succeeded == found.workflows_total, found.summary()
    assert found.workflow.wrong + found.workflow.bodies_wrong == 0, found.summary()
    assert skipped >= 1, "no duplicate delivery was skipped: the chaos had no teeth"
    assert drained.lost_past_broker <= redis_stops * len(WORKERS), drained
    engine.dispose()
