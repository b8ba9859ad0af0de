"""Durable workflows under chaos: 100 chains of 5 and 50 chords of 10, every step once.

On real PostgreSQL and a throwaway Redis of the test's own, two prefork workers (2
processes each) run the same canvases (:mod:`tests.reliability.workflow_tally`):

- ``outbox``: atomic ``OutboxTask`` steps, no result backend, the canvases dispatched
  in database transactions (10 per transaction); the test process sweeps the outbox all
  along (the relay of rows whose on-commit publish failed), and makes one published row
  in five pending again (:class:`~tests.reliability.chaos.Chaos`), so that the sweep
  publishes the same step a second time (chord header steps included);
- ``plain``: the same canvases of plain Celery tasks (``acks_late``,
  ``reject_on_worker_lost``) with Celery's chord join in a Redis result backend.

Meanwhile one pool child of each worker (never its main process) is SIGKILLed every
0.5 s, and the broker is stopped once mid-dispatch (SIGTERM) and started again after
``OUTAGE`` s; the outbox dispatches of that time commit with the broker down. A worker
that exits, or stalls with work left (kombu's Redis transport sometimes stops consuming
after "Couldn't ack ... ConnectionError"), is restarted, as a process manager would
(:class:`~tests.reliability.harness.Supervisor`); the restarts are reported.

The outbox must end with every ``Workflow`` ``succeeded`` (``steps_done ==
steps_total``: 5 and 11), every step's effect exactly once (``wfc_effect`` has a
primary key; ``wfc_run``, written in the same transaction with no key, counts committed
runs) and every chord body once with its header's results in order.
``outbox_max_deliveries`` is 50, not 5: a step whose child is killed under it five times
would otherwise become a dead letter, by design (a message that keeps killing its
worker), which is not what this measures; in practice a step is killed at most two or
three times.

A message the broker hands to kombu's consumer (``BRPOP``) just before it stops is gone
with it (celery/kombu#305, see ``test_broker_outage.py``): that is past the outbox (its row
is ``published``). If the outbox goes quiet with a workflow unfinished, the rows
published and never completed are counted as ``lost_past_broker`` (at most one per
consuming connection) and made pending again, as an operator would republish them.
The plain variant's lost, duplicated and wrong steps and chord bodies are recorded, not
asserted. About 90 s: ``slow``.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable

import pytest
from sqlalchemy.orm import Session

from tests.conftest import StartWorker
from tests.reliability import ledger
from tests.reliability.chaos import REPUBLISH_ONE_IN, Chaos
from tests.reliability.conftest import RecordResult
from tests.reliability.harness import ScenarioEnv, pending_rows, sqlalchemy_url
from tests.reliability.servers import ThrowawayRedis
from tests.reliability.workflow_chaos import (
    Queues,
    Workers,
    count,
    run_to_the_end,
    workflows,
)
from tests.reliability.workflow_chaos_app import (
    SKIPPED,
    create_outbox_app,
    create_plain_app,
    create_wfc_tables,
    plain_run_table,
    run_table,
    runs,
)
from tests.reliability.workflow_tally import (
    CHAIN_STEPS,
    CHAINS,
    CHORDS,
    HEADER,
    STEPS,
    WorkflowTally,
    bodies_lost_after_a_duplicate,
    canvases,
    expected,
    tally,
)
from tests.worker import WorkerProcess

pytestmark = pytest.mark.slow

#: Canvases per dispatching transaction (and per plain dispatch round).
BATCH = 10
#: Seconds between two kills of a pool child (of each worker).
KILL_EVERY = 0.5
#: The broker stops before this dispatch round, for this many seconds.
OUTAGE_AT, OUTAGE = 7, 3.0
#: Dispatch rounds made while the broker is down (the plain variant's wait for it).
OUTAGE_ROUNDS = 2
CONF = {"outbox_keep_published": 3600.0, "outbox_max_deliveries": 50}
#: Longest wait for every outbox workflow (then for the plain variant to go quiet).
RUN_TIMEOUT = 300.0
#: Messages one broker stop may take past the broker: one BRPOP reply per consumer.
MAX_LOST_PAST_BROKER = 1
WORKER_MODULE = "tests.reliability.workflow_chaos_app"
NONE_WRONG = WorkflowTally(
    lost=0, duplicates=0, wrong=0, bodies_lost=0, bodies_duplicated=0, bodies_wrong=0
)


def test_workflows_succeed_once_each_under_kills_and_a_broker_restart(
    throwaway_redis: ThrowawayRedis,
    postgres_database_url: str,
    make_scenario_env: Callable[..., ScenarioEnv],
    record_result: RecordResult,
    celery_worker_process: StartWorker,  # last: its workers stop before Redis and the database
) -> None:
    base = throwaway_redis.url.rsplit("/", 1)[0]
    env = make_scenario_env(broker=f"{base}/0", db_url=postgres_database_url)
    queues = Queues(outbox=(env.broker, env.queue), plain=(f"{base}/2", f"{env.queue}-plain"))
    backend, db_url = f"{base}/1", sqlalchemy_url(postgres_database_url)
    ledger_dir = str(env.ledger_dir)
    app, store = create_outbox_app(
        broker=env.broker, db_url=db_url, queue=env.queue, ledger_dir=ledger_dir, **CONF
    )
    plain_app, plain_engine = create_plain_app(
        broker=queues.plain[0],
        backend=backend,
        db_url=db_url,
        queue=queues.plain[1],
        ledger_dir=ledger_dir,
    )
    engine = store.engine
    create_wfc_tables(engine)
    worker_envs = {
        "outbox": {**env.as_env(), "RELIABILITY_CONF": json.dumps(CONF)},
        "plain": {
            **env.as_env(),
            "RELIABILITY_BROKER": queues.plain[0],
            "RELIABILITY_QUEUE": queues.plain[1],
            "WFC_VARIANT": "plain",
            "WFC_BACKEND": backend,
        },
    }

    def starter(name: str) -> Callable[[], WorkerProcess]:
        queue = (queues.outbox if name == "outbox" else queues.plain)[1]
        return lambda: celery_worker_process(
            WORKER_MODULE, queue=queue, env=worker_envs[name], pool="prefork", concurrency=2
        )

    workers = Workers(
        {name: starter(name) for name in worker_envs},
        chaos=lambda worker: Chaos(app, store, worker),
        kill_every=KILL_EVERY,
    )
    outbox_canvases = canvases(app, "o-", plain=False)
    plain_canvases = canvases(plain_app, "p-", plain=True)

    started = time.monotonic()
    plain_left: list[int] = []
    outage_end, pending_at_restart = 0.0, 0
    for number, first in enumerate(range(0, len(outbox_canvases), BATCH)):
        if number == OUTAGE_AT:
            throwaway_redis.stop()
            outage_end = time.monotonic() + OUTAGE
        if number == OUTAGE_AT + OUTAGE_ROUNDS:
            while time.monotonic() < outage_end:
                workers.step()
                time.sleep(0.1)
            pending_at_restart = pending_rows(engine)
            throwaway_redis.start()
        with Session(engine) as session, session.begin(), store.bind_session(session):
            for canvas in outbox_canvases[first : first + BATCH]:
                canvas.apply_async()
        plain_left.append(first)
        if not OUTAGE_AT <= number < OUTAGE_AT + OUTAGE_ROUNDS:
            for waiting in plain_left:
                for canvas in plain_canvases[waiting : waiting + BATCH]:
                    canvas.apply_async()
            plain_left.clear()
        workers.step()
    dispatch_seconds = time.monotonic() - started

    outcome = run_to_the_end(
        workers, engine, queues, workflows_total=CHAINS + CHORDS, timeout=RUN_TIMEOUT
    )
    seconds = time.monotonic() - started

    flows = workflows(engine)
    outbox = tally(expected("o-"), runs(engine, run_table))
    plain_runs = runs(engine, plain_run_table)
    plain = tally(expected("p-"), plain_runs)
    started_runs = ledger.events(env.ledger_dir, ledger.STARTED)
    skipped = sum(ledger.events(env.ledger_dir, SKIPPED).values())
    common = {
        "children_killed": workers.kills,
        "tasks_killed": workers.tasks_killed(),
        "dispatch_seconds": round(dispatch_seconds, 1),
        "seconds": round(seconds, 1),
    }
    shape = f"{CHAINS} chains of 5 and {CHORDS} chords of 10 (+ body)"
    chaos = (
        f"a pool child of each worker SIGKILLed every {KILL_EVERY} s, "
        f"the broker stopped for {OUTAGE} s once"
    )
    record_result(
        "workflow_chaos_outbox",
        title=f"Workflows of atomic OutboxTasks: {shape}; {chaos}",
        tasks=STEPS,
        lost=outbox.lost + outbox.bodies_lost,
        duplicates=outbox.duplicates + outbox.bodies_duplicated,
        notes=(
            f"{sum(f.status == 'succeeded' for f in flows)}/{len(flows)} workflows succeeded; "
            f"1 in {REPUBLISH_ONE_IN} published rows republished; no result backend; "
            "prefork x2, Redis, PostgreSQL; run beside the plain canvas"
        ),
        extra={
            **common,
            "wrong_values": outbox.wrong + outbox.bodies_wrong,
            "bodies_lost": outbox.bodies_lost,
            "bodies_duplicated": outbox.bodies_duplicated,
            "body_runs": sum(n for key, n in started_runs.items() if key.startswith("o-")),
            "duplicates_skipped": skipped,
            "republished_rows": workers.chaos.republished,
            "pending_at_broker_restart": pending_at_restart,
            "lost_past_broker": outcome.lost_past_broker,
            "seconds_to_all_succeeded": round(max(0.0, outcome.outbox_done_at - started), 1),
            "worker_restarts": workers.restarts("outbox"),
            "timed_out": outcome.timed_out,
        },
    )
    record_result(
        "workflow_chaos_plain",
        title=f"Plain Celery canvas (Redis result backend): {shape}; {chaos}",
        tasks=STEPS,
        lost=plain.lost + plain.bodies_lost,
        duplicates=plain.duplicates + plain.bodies_duplicated,
        notes="plain tasks, acks_late + reject_on_worker_lost; recorded, not asserted",
        extra={
            **common,
            "wrong_values": plain.wrong + plain.bodies_wrong,
            "bodies_lost": plain.bodies_lost,
            "bodies_duplicated": plain.bodies_duplicated,
            "bodies_wrong": plain.bodies_wrong,
            "bodies_lost_after_a_duplicated_header_step": bodies_lost_after_a_duplicate(
                "p-", plain_runs
            ),
            "body_runs": sum(n for key, n in started_runs.items() if key.startswith("p-")),
            "worker_restarts": workers.restarts("plain"),
        },
    )

    log = workers.supervisors["outbox"].worker.log_text()[-3000:]
    assert workers.kills >= 10, "hardly any pool child was killed: the scenario did not happen"
    assert pending_at_restart >= 1, "nothing waited for the broker: the outage did not happen"
    assert len(flows) == CHAINS + CHORDS, f"{len(flows)} workflow rows"
    unfinished = [
        (f.name, f.status, f.steps_done, f.steps_total)
        for f in flows
        if f.status != "succeeded" or f.steps_done != f.steps_total
    ]
    assert not unfinished, f"{len(unfinished)} workflows unfinished: {unfinished[:5]}\n{log}"
    assert skipped >= 1, "no duplicate delivery was skipped: the scenario did not happen"
    totals = Counter(f.steps_total for f in flows)
    assert totals == {CHAIN_STEPS: CHAINS, HEADER + 1: CHORDS}, totals
    assert outbox == NONE_WRONG, outbox.summary()
    assert count(engine, run_table) == STEPS
    assert outcome.lost_past_broker <= MAX_LOST_PAST_BROKER
    plain_app.close()
    plain_engine.dispose()
    engine.dispose()
