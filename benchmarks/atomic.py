"""Atomic tasks: worker throughput of an atomic task against the same task not atomic,
and the database cost of a ``CompletedTask`` row.

Two tasks of :mod:`benchmarks.atomic_app` (the SQLAlchemy store on PostgreSQL, Redis
broker) each do one ``INSERT``: ``plain_write`` commits it on its own, ``atomic_write``
commits it with its ``CompletedTask`` row. Each case queues ``tasks`` tasks through the
outbox (100 per transaction) first, then starts a prefork worker (concurrency 2) and
measures its throughput on the database's clock: tasks/s from the first ``INSERT`` to the
last (``clock_timestamp()``), so neither the dispatching nor the worker's start-up is
timed. Each round runs plain, atomic, atomic, plain (so that a drift of the shared
machine's load cancels out); the ratio is atomic over plain within a round, the median of
rounds.

The cost per row is ``pg_total_relation_size`` of the ``CompletedTask`` table (heap,
indexes, TOAST) over its rows once every round ran (the tasks return ``None``, so
``result`` is empty: a stored result adds its own size).
"""

from __future__ import annotations

from typing import Any

from benchmarks import env
from benchmarks.processes import start_worker, wait_until
from benchmarks.stats import median

#: Tasks queued per outbox transaction.
BATCH = 100
#: The target of issue 15: atomic at least this share of the non-atomic throughput.
TARGET = 0.8
#: The order of the cases in each round.
ORDER = ("plain", "atomic", "atomic", "plain")
#: ``--quick`` (a harness check): one case of each.
QUICK_ORDER = ("plain", "atomic")


def _queue(kind: str, tasks: int) -> None:
    from sqlalchemy.orm import Session

    from benchmarks.atomic_app import atomic_write, engine, plain_write, store

    task = atomic_write if kind == "atomic" else plain_write
    for first in range(0, tasks, BATCH):
        with Session(engine) as session, session.begin(), store.bind_session(session):
            for i in range(first, min(tasks, first + BATCH)):
                task.delay(i)


def _written() -> tuple[int, float]:
    """(rows, seconds from the first ``INSERT`` to the last) of ``bench_write``."""
    from sqlalchemy import func, select

    from benchmarks.atomic_app import engine, write_table

    at = write_table.c.at
    query = select(func.count(), func.extract("epoch", func.max(at) - func.min(at)))
    with engine.connect() as conn:
        rows, seconds = conn.execute(query.select_from(write_table)).one()
    return int(rows), float(seconds or 0.0)


def _case(kind: str, tasks: int) -> float:
    """Tasks/s of a fresh worker through ``tasks`` queued tasks of ``kind``."""
    from sqlalchemy import delete

    from benchmarks.atomic_app import engine, write_table

    with engine.begin() as conn:
        conn.execute(delete(write_table))
    _queue(kind, tasks)
    worker = start_worker(app_module="benchmarks.atomic_app", pool="prefork", concurrency=2)
    try:
        wait_until(
            lambda: _written()[0] >= tasks, timeout=600, what=f"{tasks} {kind} tasks", interval=0.05
        )
    finally:
        worker.stop()
    rows, seconds = _written()
    return (rows - 1) / seconds if seconds > 0 else 0.0


def _completed_bytes() -> tuple[int, int]:
    """(rows, total bytes) of the ``CompletedTask`` table."""
    from sqlalchemy import func, select, text

    from benchmarks.atomic_app import engine, store

    table = store.tables.completed
    with engine.connect() as conn:
        rows = int(conn.execute(select(func.count()).select_from(table)).scalar_one())
        size = conn.execute(text("SELECT pg_total_relation_size(:name)"), {"name": table.name})
        return rows, int(size.scalar_one())


def _reset() -> None:
    from sqlalchemy import text

    from benchmarks.atomic_app import engine, store

    names = [store.tables.outbox.name, store.tables.completed.name]
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {', '.join(names)}"))


def run(*, tasks: int, rounds: int, quick: bool = False) -> list[dict[str, Any]]:
    """One result row: plain and atomic tasks/s, their ratio, and bytes per completion."""
    from benchmarks.atomic_app import DATABASE_URL, create_tables

    env.create_database(
        DATABASE_URL.set(drivername="postgresql").render_as_string(hide_password=False)
    )
    create_tables()
    _reset()
    env.purge_broker()
    samples: dict[str, list[float]] = {"plain": [], "atomic": []}
    ratios = []
    try:
        for _ in range(rounds):
            measured = {kind: 0.0 for kind in samples}
            for kind in QUICK_ORDER if quick else ORDER:
                value = _case(kind, tasks)
                samples[kind].append(value)
                measured[kind] += value
            ratios.append(measured["atomic"] / measured["plain"] if measured["plain"] else 0.0)
        rows, size = _completed_bytes()
    finally:
        env.purge_broker()
    return [
        {
            "benchmark": "atomic",
            "case": f"1 INSERT per task, prefork x2, {tasks} tasks",
            "unit": "tasks/s",
            "tasks": tasks,
            "rounds": rounds,
            "plain": median(samples["plain"]),
            "ours": median(samples["atomic"]),
            "ratio": median(ratios),
            "target": TARGET,
            "completed_rows": rows,
            "completed_bytes_per_row": size / rows if rows else 0.0,
            "samples": samples,
        }
    ]
