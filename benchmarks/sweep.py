"""Sweep throughput: N pending rows published by the sweeper vs a plain ``apply_async`` loop.

The rows are bulk-inserted first (not timed), as if their process had died after COMMIT.
The sweeper runs with ``outbox_publish_grace=0`` and the default batch size until no row is
left; the plain loop publishes the same tasks (same arguments) with ``apply_async``. Both
publish to the same Redis queue, emptied between rounds. The row says whether the outbox
table had column statistics (:func:`table_analysed`): the claim's plan depends on them,
and an earlier benchmark's ``ANALYZE`` leaves them in the database (``TRUNCATE`` keeps
them), so the first run in a new database measures the unanalysed table.
"""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import timedelta
from typing import Any

from benchmarks import env
from benchmarks.stats import median, ratio


def sweeper() -> Any:
    """The sweeper of the benchmark app, publishing rows of any age."""
    from benchmarks.app import app
    from celery_outbox.config import OutboxConfig
    from celery_outbox.registry import store_for
    from celery_outbox.relay.relay import relay_for
    from celery_outbox.relay.sweeper import Sweeper

    config = replace(OutboxConfig.from_celery(app), publish_grace=timedelta(0))
    return Sweeper(
        app=app,
        store=store_for(app),
        relay=relay_for(app),
        config=config,
        budget=timedelta(hours=1),
    )


def sweep_round(rows: int) -> float:
    """Seed ``rows`` rows, sweep them all; rows/s of the sweep alone."""
    from benchmarks.app import outbox_noop

    env.reset_outbox()
    env.purge_broker()
    from benchmarks.seeding import seed_outbox

    seed_outbox(outbox_noop, rows)
    sweep = sweeper()
    started = time.perf_counter()
    published = sweep.sweep().published
    elapsed = time.perf_counter() - started
    if published != rows or env.queue_length() != rows:
        raise RuntimeError(
            f"the sweep published {published} of {rows} rows ({env.queue_length()} in the queue)"
        )
    env.purge_broker()
    return rows / elapsed


def plain_round(rows: int) -> float:
    """``apply_async`` the same ``rows`` tasks one by one; tasks/s."""
    from benchmarks.app import plain_noop

    env.purge_broker()
    started = time.perf_counter()
    for i in range(rows):
        plain_noop.apply_async((i,))
    elapsed = time.perf_counter() - started
    env.purge_broker()
    return rows / elapsed


def table_analysed() -> bool:
    """Whether the outbox table has column statistics: an ``ANALYZE`` of it (another
    benchmark's, or autovacuum's) left them, and ``TRUNCATE`` keeps them. With them a
    claim reads the due index in order; without them (a database whose outbox was never
    analysed) it sorts every due row, ~9 ms more per claim of a 20,000-row backlog.
    """
    from django.db import connection

    from celery_outbox.store.records import OUTBOX_TABLE

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stats WHERE tablename = %s", [OUTBOX_TABLE])
        (count,) = cursor.fetchone()
    return bool(count)


def run(*, rows: int, rounds: int) -> list[dict[str, Any]]:
    """One result row: our sweep vs the plain loop, medians of ``rounds``."""
    sweep_round(min(rows, 500))  # warm-up: connections, imports
    plain_round(min(rows, 500))
    plain, ours = [], []
    for _ in range(rounds):
        ours.append(sweep_round(rows))
        plain.append(plain_round(rows))
    env.reset_outbox()
    analysed = table_analysed()
    state = "column statistics kept from an earlier ANALYZE" if analysed else "never analysed"
    return [
        {
            "benchmark": "sweep",
            "case": f"{rows} rows, table {state}",
            "table_analysed": analysed,
            "unit": "rows/s",
            "tasks": rows,
            "rounds": rounds,
            "plain": median(plain),
            "ours": median(ours),
            "ratio": ratio(median(ours), median(plain)),
            "target": 1.5,
            "samples": {"plain": plain, "ours": ours},
        }
    ]
