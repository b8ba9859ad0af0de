"""Atomic tasks: worker throughput of an atomic task against the same task not atomic,
and the database cost of a ``CompletedTask`` row.

A prefork worker (concurrency 2) of :mod:`benchmarks.atomic_app` (the SQLAlchemy store on
PostgreSQL, Redis broker). Each case dispatches ``tasks`` tasks through the outbox (100
per transaction) and measures tasks/s from the first dispatch to the last committed
``INSERT`` (counted in the database): ``plain_write`` commits its one ``INSERT`` on its
own, ``atomic_write`` commits it with its ``CompletedTask`` row. Rounds alternate the two
cases; the ratio is atomic over plain in the same round, the median of rounds.

The cost per row is ``pg_total_relation_size`` of the ``CompletedTask`` table (heap,
indexes, TOAST) over its rows once every round ran (the tasks return ``None``, so
``result`` is empty: a stored result adds its own size).
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks import env
from benchmarks.processes import start_worker, wait_until
from benchmarks.stats import median

#: Tasks dispatched per outbox transaction.
BATCH = 100
#: The target of issue 15: atomic at least this share of the non-atomic throughput.
TARGET = 0.8


def _written(kind: str) -> int:
    from sqlalchemy import func, select

    from benchmarks.atomic_app import engine, write_table

    query = select(func.count()).select_from(write_table).where(write_table.c.kind == kind)
    with engine.connect() as conn:
        return int(conn.execute(query).scalar_one())


def _case(kind: str, tasks: int) -> float:
    from sqlalchemy.orm import Session

    from benchmarks.atomic_app import atomic_write, engine, plain_write, store

    task = atomic_write if kind == "atomic" else plain_write
    before = _written(kind)
    started = time.perf_counter()
    for first in range(0, tasks, BATCH):
        with Session(engine) as session, session.begin(), store.bind_session(session):
            for i in range(first, min(tasks, first + BATCH)):
                task.delay(i)
    wait_until(
        lambda: _written(kind) >= before + tasks,
        timeout=600,
        what=f"{tasks} {kind} tasks",
        interval=0.01,
    )
    return tasks / (time.perf_counter() - started)


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

    from benchmarks.atomic_app import engine, store, write_table

    names = [write_table.name, store.tables.outbox.name, store.tables.completed.name]
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {', '.join(names)}"))


def run(*, tasks: int, rounds: int) -> list[dict[str, Any]]:
    """One result row: plain and atomic tasks/s, their ratio, and bytes per completion."""
    from benchmarks.atomic_app import DATABASE_URL, create_tables

    env.create_database(DATABASE_URL.set(drivername="postgresql").render_as_string(hide_password=False))
    create_tables()
    _reset()
    worker = start_worker(app_module="benchmarks.atomic_app", pool="prefork", concurrency=2)
    try:
        for kind in ("plain", "atomic"):  # warm-up: imports, connections, pool children
            _case(kind, min(tasks, 100))
        samples: dict[str, list[float]] = {"plain": [], "atomic": []}
        for _ in range(rounds):
            for kind in samples:
                samples[kind].append(_case(kind, tasks))
        rows, size = _completed_bytes()
    finally:
        worker.stop()
        env.purge_broker()
    ratios = [a / p for a, p in zip(samples["atomic"], samples["plain"], strict=True)]
    return [
        {
            "benchmark": "atomic",
            "case": "1 INSERT per task, prefork x2",
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
