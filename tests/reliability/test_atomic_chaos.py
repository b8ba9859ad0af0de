"""Atomic tasks under chaos: exactly-once effects while deliveries die and repeat.

500 tasks each add one to a counter row and dispatch one follow-up task, which records
itself in a table (:mod:`tests.reliability.atomic_app`), on real PostgreSQL, Redis and a
prefork worker (2 processes). Meanwhile (:mod:`tests.reliability.chaos`) one of its pool
children is SIGKILLed every half second (each in turn), and one published row in five,
parents and follow-ups alike, is made pending again so that the sweep publishes the same
message (same task id) a second time.

Both variants run side by side in the same run (one worker, the same kills and
republishes), each with its own counter, effects and task ids:

- ``atomic``: the tasks are ``atomic = True``. The counter must be exactly N, and the
  follow-ups exactly N (N rows, N distinct keys): every duplicate delivery was skipped,
  every killed run rolled back and ran again, nothing was lost.
- ``plain``: their ``atomic = False`` twins. Nothing is lost either, but the duplicates
  run again: the counter ends above N, and the test asserts it does (it is what proves
  the chaos above produced duplicate deliveries to absorb).

Both record their counts for ``docs/reliability.md``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
import redis
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from celery_outbox.store.records import MessageStatus
from tests.conftest import StartWorker
from tests.reliability import ledger
from tests.reliability.atomic_app import (
    SKIPPED,
    VARIANTS,
    counter,
    create_chaos_app,
    create_chaos_tables,
    effect_rows,
    effects,
)
from tests.reliability.chaos import REPUBLISH_ONE_IN, Chaos
from tests.reliability.conftest import RecordResult
from tests.reliability.harness import ScenarioEnv

#: About 40 s: like every worker scenario here, kept out of the quick ``-m "not slow"`` run
#: (CI runs it).
pytestmark = pytest.mark.slow

#: Parent tasks (each dispatches one follow-up).
TASKS = 500
#: Parents per dispatching transaction.
BATCH = 50
#: Seconds between two kills of a pool child.
KILL_EVERY = 0.5
#: Keep published rows, so that the chaos can publish some again.
CONF = {"outbox_keep_published": 3600.0}
#: Longest wait for every follow-up, then for the duplicates to drain.
RUN_TIMEOUT, DRAIN_TIMEOUT = 120.0, 180.0
#: Seconds the counts must stay still, with nothing pending, to call the run over.
QUIET = 2.0


def _wait_quiet(
    chaos: Chaos, progress: Callable[[], tuple[int, ...]], complete: Callable[[], bool]
) -> None:
    """Sweep (no more kills) until nothing is pending, ``progress`` stood still and every
    effect is in (``complete``), or :data:`DRAIN_TIMEOUT` passed: on a loaded machine a
    message a killed child left may come back only after a backoff (an ETA the worker
    holds, invisible to the queue and the table), which is late, not lost.
    """
    deadline = time.monotonic() + DRAIN_TIMEOUT
    last, since = progress(), time.monotonic()
    while time.monotonic() < deadline:
        chaos.step(kill=False)
        now = progress()
        if now != last or now[-2:] != (0, 0):
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= QUIET and complete():
            return
        time.sleep(0.1)


def test_effects_exactly_once_under_kills_and_republishes(
    celery_worker_process: StartWorker,
    redis_url: str,
    redis_queue: str,
    postgres_database_url: str,
    make_scenario_env: Callable[..., ScenarioEnv],
    record_result: RecordResult,
) -> None:
    env = make_scenario_env(broker=redis_url, db_url=postgres_database_url)
    app, store = create_chaos_app(
        broker=env.broker,
        db_url=env.db_url,
        queue=env.queue,
        ledger_dir=str(env.ledger_dir),
        **CONF,
    )
    engine = store.engine
    create_chaos_tables(engine)
    worker = celery_worker_process(
        "tests.reliability.atomic_app",
        queue=env.queue,
        env={**env.as_env(), "RELIABILITY_CONF": json.dumps(CONF)},
        pool="prefork",
        concurrency=2,
    )
    keys = [f"k{i}" for i in range(TASKS)]
    chaos = Chaos(app, store, worker, kill_every=KILL_EVERY)

    started = time.monotonic()
    for first in range(0, TASKS, BATCH):
        with Session(engine) as session, session.begin(), store.bind_session(session):
            for key in keys[first : first + BATCH]:
                for variant, (add_task, _follow) in VARIANTS.items():
                    app.tasks[add_task].apply_async((key,), task_id=f"{variant}-{key}")
        chaos.step()
    deadline = started + RUN_TIMEOUT
    while time.monotonic() < deadline and any(
        effects(engine, f"{variant}-follow")[1] < set(keys) for variant in VARIANTS
    ):
        chaos.step()
        time.sleep(0.05)
    chaos_seconds = time.monotonic() - started

    broker = redis.Redis.from_url(env.broker)

    def progress() -> tuple[int, ...]:
        runs = ledger.events(env.ledger_dir, ledger.STARTED)
        pending = store.count_by_status().get(MessageStatus.PENDING, 0)
        return (effect_rows(engine), sum(runs.values()), pending, int(broker.llen(env.queue)))

    def complete() -> bool:
        return all(
            effects(engine, f"{variant}-{kind}")[1] >= set(keys)
            for variant in VARIANTS
            for kind in ("add", "follow")
        )

    _wait_quiet(chaos, progress, complete)
    broker.close()

    log = worker.log_text()[-3000:]
    assert chaos.kills >= 1, "no pool child was killed: the scenario did not happen"
    assert chaos.republished >= 1, "no row was republished: the scenario did not happen"
    runs = ledger.events(env.ledger_dir, ledger.STARTED)
    skipped = sum(ledger.events(env.ledger_dir, SKIPPED).values())
    outcomes = {}
    for variant in VARIANTS:
        outcomes[variant] = _record(
            variant,
            engine=engine,
            keys=set(keys),
            runs=sum(n for key, n in runs.items() if key.startswith(f"{variant}-")),
            skipped=skipped if variant == "atomic" else 0,
            chaos=chaos,
            seconds=chaos_seconds,
            record_result=record_result,
        )
    for variant, (total, adds, add_keys, _follows, follow_keys) in outcomes.items():
        expected = set(keys)
        assert add_keys == expected, f"{variant}: lost parents {sorted(expected - add_keys)[:5]}"
        assert follow_keys == expected, (
            f"{variant}: lost follow-ups {sorted(expected - follow_keys)[:5]}\n{log}"
        )
        assert total == adds, f"{variant}: the counter and the effect rows disagree"
    total, _adds, _keys, follows, _follow_keys = outcomes["atomic"]
    assert (total, follows) == (TASKS, TASKS), f"duplicates ran: counter={total}, {follows=}"
    assert skipped >= 1, "no duplicate delivery was skipped: the scenario did not happen"
    assert outcomes["plain"][0] > TASKS, "the non-atomic twin ran no duplicate: no teeth"
    engine.dispose()


def _record(
    variant: str,
    *,
    engine: Engine,
    keys: set[str],
    runs: int,
    skipped: int,
    chaos: Chaos,
    seconds: float,
    record_result: RecordResult,
) -> tuple[int, int, set[str], int, set[str]]:
    """Count ``variant``'s effects, record them for docs/reliability.md, and return
    ``(counter, parent rows, parent keys, follow-up rows, follow-up keys)``.
    """
    total = counter(engine, variant)
    adds, add_keys = effects(engine, f"{variant}-add")
    follows, follow_keys = effects(engine, f"{variant}-follow")
    lost = len(keys - add_keys) + len(keys - follow_keys)
    duplicates = (adds - len(add_keys)) + (follows - len(follow_keys))
    share = f"1 in {REPUBLISH_ONE_IN}"
    record_result(
        f"atomic_chaos_{variant}",
        title=(
            f"{'Atomic' if variant == 'atomic' else 'Non-atomic (atomic=False twin)'} tasks: "
            f"a pool child SIGKILLed every {KILL_EVERY} s, {share} published rows republished"
        ),
        tasks=2 * len(keys),
        lost=lost,
        duplicates=duplicates,
        notes=(
            f"{len(keys)} tasks each +1 on a counter and 1 follow-up; counter={total} "
            f"(expected {len(keys)}); both variants in one run; prefork x2, Redis, PostgreSQL"
        ),
        extra={
            "follow_ups": follows,
            "follow_ups_distinct": len(follow_keys),
            "children_killed": chaos.kills,
            "tasks_killed": chaos.tasks_killed(),
            "republished_rows": chaos.republished,
            "body_runs": runs,
            "runs_rolled_back": runs - adds - follows,
            "duplicates_skipped": skipped,
            "seconds": round(seconds, 1),
        },
    )
    return total, adds, add_keys, follows, follow_keys
