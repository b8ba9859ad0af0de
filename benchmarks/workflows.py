"""Workflows: a 5-step chain end to end, durable (atomic ``OutboxTask`` steps, no result
backend) against Celery's canvas of plain tasks with a Redis result backend.

Both sides run :mod:`benchmarks.workflow_app` on a prefork worker (concurrency 2), Redis
broker, PostgreSQL. Each chain is dispatched in a transaction of its own that writes its
``bench_wf_chain`` row (database clock): the outbox side dispatches the chain in that
transaction (its first step and its ``Workflow`` row are written with it, published on
commit); the plain side calls ``apply_async`` right after the commit, as an ``on_commit``
callback would. Every step does the same business write, one ``INSERT`` (the plain one in
its own transaction).

A case starts a fresh worker, runs a few warm-up chains (connections, imports), then
dispatches ``chains`` chains one after the other and waits until every chain's last step
committed. End to end is the database's clock from the first chain's row to the last
step's; steps/s is ``5 * chains`` over it; a chain's latency runs from its own row to its
last step. Rounds run plain, outbox, outbox, plain (a drift of the shared machine's load
cancels out); the ratio is outbox over plain steps/s within a round, the median of rounds.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks import env
from benchmarks.processes import start_worker, wait_until
from benchmarks.stats import median, percentile

#: The target of issue 16: durable chains at least this share of Celery's steps/s.
TARGET = 0.7
#: The order of the cases in each round.
ORDER = ("plain", "outbox", "outbox", "plain")
#: ``--quick`` (a harness check): one case of each.
QUICK_ORDER = ("plain", "outbox")
#: Chains run (and not measured) on each fresh worker before the measured ones.
WARM_UP = 4


def _chain(kind: str, i: int) -> Any:
    from celery import chain

    from benchmarks.workflow_app import STEPS, atomic_step, plain_step

    task = atomic_step if kind == "outbox" else plain_step
    return chain(task.s(0, i), *(task.s(i) for _ in range(STEPS - 1)))


def _dispatch(kind: str, chains: range) -> None:
    """One transaction per chain: its row, and the chain (in it, or right after it)."""
    from sqlalchemy import insert
    from sqlalchemy.orm import Session

    from benchmarks.workflow_app import chain_table, engine, store

    for i in chains:
        if kind == "outbox":
            with Session(engine) as session, session.begin(), store.bind_session(session):
                session.execute(insert(chain_table).values(chain=i))
                _chain(kind, i).apply_async()
        else:
            with engine.begin() as conn:
                conn.execute(insert(chain_table).values(chain=i))
            _chain(kind, i).apply_async()


def _finished(first: int, count: int) -> bool:
    """Whether the last step of each chain ``first .. first + count - 1`` committed."""
    from sqlalchemy import func, select

    from benchmarks.workflow_app import STEPS, step_table

    query = select(func.count()).where(
        step_table.c.step == STEPS, step_table.c.chain >= first, step_table.c.chain < first + count
    )
    with _engine().connect() as conn:
        return int(conn.execute(query).scalar_one()) >= count


def _engine() -> Any:
    from benchmarks.workflow_app import engine

    return engine


def _timings(chains: int) -> tuple[float, list[float]]:
    """(seconds from the first chain's row to the last step, each chain's latency)."""
    from sqlalchemy import func, select

    from benchmarks.workflow_app import STEPS, chain_table, step_table

    last = func.extract("epoch", func.max(step_table.c.at))
    query = (
        select(func.extract("epoch", chain_table.c.at), last, func.count())
        .join(step_table, step_table.c.chain == chain_table.c.chain)
        .where(chain_table.c.chain >= 0)
        .group_by(chain_table.c.chain, chain_table.c.at)
    )
    with _engine().connect() as conn:
        rows = [(float(start), float(end), int(n)) for start, end, n in conn.execute(query)]
    if len(rows) != chains or any(n != STEPS for _, _, n in rows):
        raise RuntimeError(f"expected {chains} chains of {STEPS} steps, got {rows[:5]}...")
    seconds = max(end for _, end, _ in rows) - min(start for start, _, _ in rows)
    return seconds, [end - start for start, end, _ in rows]


def _succeeded_workflows() -> int:
    from sqlalchemy import func, select

    from benchmarks.workflow_app import store

    table = store.tables.workflow
    query = select(func.count()).select_from(table).where(table.c.status == "succeeded")
    with _engine().connect() as conn:
        return int(conn.execute(query).scalar_one())


def _case(kind: str, chains: int) -> dict[str, float]:
    """A fresh worker of ``kind`` through ``chains`` chains: its timings."""
    from benchmarks.workflow_app import STEPS

    _reset()
    worker = start_worker(
        app_module=f"benchmarks.workflow_app:{kind}_app", pool="prefork", concurrency=2
    )
    try:
        _dispatch(kind, range(-WARM_UP, 0))
        wait_until(lambda: _finished(-WARM_UP, WARM_UP), timeout=120, what="warm-up chains")
        started = time.perf_counter()
        _dispatch(kind, range(chains))
        dispatched = time.perf_counter() - started
        wait_until(
            lambda: _finished(0, chains), timeout=600, what=f"{chains} {kind} chains", interval=0.1
        )
    finally:
        worker.stop()
    if kind == "outbox" and _succeeded_workflows() != chains + WARM_UP:
        raise RuntimeError(f"{_succeeded_workflows()} workflows succeeded, not {chains + WARM_UP}")
    seconds, latencies = _timings(chains)
    return {
        "seconds": seconds,
        "steps_per_s": STEPS * chains / seconds if seconds > 0 else 0.0,
        "dispatch_s": dispatched,
        "p50_ms": 1000 * percentile(latencies, 0.5),
        "p95_ms": 1000 * percentile(latencies, 0.95),
    }


def _reset() -> None:
    from sqlalchemy import text

    from benchmarks.workflow_app import chain_table, step_table, store

    tables = [*store.tables, chain_table, step_table]
    with _engine().begin() as conn:
        conn.execute(text(f"TRUNCATE {', '.join(table.name for table in tables)}"))


def _purge_results() -> None:
    """Delete the plain side's stored results (``celery-task-meta-*``)."""
    import redis

    from benchmarks.workflow_app import RESULT_URL

    client = redis.Redis.from_url(RESULT_URL)
    keys = list(client.scan_iter(match="celery-task-meta-*", count=1000))
    if keys:
        client.delete(*keys)


def _median_of(samples: list[dict[str, float]], field: str) -> float:
    return median([sample[field] for sample in samples])


def run(*, chains: int, rounds: int, quick: bool = False) -> list[dict[str, Any]]:
    """One result row: steps/s of each side, their ratio, end-to-end seconds, latencies."""
    from benchmarks.workflow_app import DATABASE_URL, STEPS, create_tables

    env.create_database(
        DATABASE_URL.set(drivername="postgresql").render_as_string(hide_password=False)
    )
    create_tables()
    env.purge_broker()
    samples: dict[str, list[dict[str, float]]] = {"plain": [], "outbox": []}
    ratios = []
    try:
        for _ in range(rounds):
            measured = {kind: 0.0 for kind in samples}
            for kind in QUICK_ORDER if quick else ORDER:
                sample = _case(kind, chains)
                samples[kind].append(sample)
                measured[kind] += sample["steps_per_s"]
            ratios.append(measured["outbox"] / measured["plain"] if measured["plain"] else 0.0)
    finally:
        env.purge_broker()
        _purge_results()
    row: dict[str, Any] = {
        "benchmark": "workflows",
        "case": f"{chains} chains of {STEPS} steps, prefork x2",
        "unit": "steps/s",
        "chains": chains,
        "rounds": rounds,
        "plain": _median_of(samples["plain"], "steps_per_s"),
        "ours": _median_of(samples["outbox"], "steps_per_s"),
        "ratio": median(ratios),
        "target": TARGET,
        "samples": samples,
    }
    for side, kind in (("plain", "plain"), ("ours", "outbox")):
        for field in ("seconds", "dispatch_s", "p50_ms", "p95_ms"):
            row[f"{side}_{field}"] = _median_of(samples[kind], field)
    return [row]
