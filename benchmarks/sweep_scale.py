"""Sweep scale: several sweeper processes on one backlog, and an empty sweep over parked rows.

- ``sweepers``: ``rows`` pending rows (bulk-inserted, not timed) swept by 1, 2 and 4
  processes at once (``SKIP LOCKED`` claims: each row is published by exactly one). Each
  process sets Django up, connects to the broker and sweeps once (an empty sweep: its
  warm-up), then waits for the start; the time is from the start to the last process's
  end. Each process reports its CPU time: on a 2-core host, CPU time of the sweepers
  near 2 x the wall time means the sweepers' own CPU is the limit; far below it, the
  database or the broker (Redis) is.
- ``empty sweep``: ``parked`` rows parked a day ahead (one ``INSERT ... SELECT
  generate_series``, then ``VACUUM ANALYZE``), and a sweep that finds none due:
  ``Sweeper.sweep()``, its claim (and the sweep record's read) included, median and p99
  of :data:`EMPTY_SWEEPS` sweeps, against the issue's 5 ms; the claim's plan is shown.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from typing import Any

from benchmarks import env
from benchmarks.stats import median, percentile

#: Sweeper processes per case.
PROCESSES = (1, 2, 4)
#: Empty sweeps timed over the parked rows.
EMPTY_SWEEPS = 200
#: The issue's bound on one empty sweep, in milliseconds.
EMPTY_TARGET_MS = 5.0


def _sweeper_process(ready: Any, go: Any, results: Any) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    import django

    django.setup()  # the parent created and migrated the database
    from benchmarks.sweep import sweeper

    sweep = sweeper()
    sweep.sweep()  # warm-up: connections (the table is empty or being filled: nothing due yet)
    ready.release()
    go.wait()
    cpu = time.process_time()
    published = sweep.sweep().published
    results.put((published, time.time(), time.process_time() - cpu))
    sweep.relay.close()


def _seed_due(rows: int) -> None:
    from benchmarks.app import outbox_noop
    from benchmarks.seeding import seed_outbox

    env.reset_outbox()
    env.purge_broker()
    seed_outbox(outbox_noop, rows)


def sweepers_round(rows: int, processes: int) -> dict[str, float]:
    """``processes`` sweepers on ``rows`` rows: rows/s and the sweepers' CPU share."""
    ctx = multiprocessing.get_context("spawn")
    ready, go, results = ctx.Semaphore(0), ctx.Event(), ctx.Queue()
    env.reset_outbox()
    env.purge_broker()
    children = [
        ctx.Process(target=_sweeper_process, args=(ready, go, results)) for _ in range(processes)
    ]
    for child in children:
        child.start()
    try:
        for _ in children:
            if not ready.acquire(timeout=120):
                raise TimeoutError("a sweeper process did not get ready in 120 s")
        _seed_due(rows)
        started = time.time()
        go.set()
        outcomes = [results.get(timeout=600) for _ in children]
    finally:
        for child in children:
            child.join(timeout=60)
            if child.is_alive():
                child.kill()
    published = sum(p for p, _, _ in outcomes)
    if published != rows or env.queue_length() != rows:
        raise RuntimeError(f"{processes} sweepers published {published} of {rows} rows")
    elapsed = max(end for _, end, _ in outcomes) - started
    env.purge_broker()
    return {"rate": rows / elapsed, "cpu_share": sum(c for _, _, c in outcomes) / elapsed}


def seed_parked(rows: int) -> None:
    """``rows`` pending rows parked a day ahead, then ``VACUUM ANALYZE``."""
    from django.db import connection

    from celery_outbox.store.records import OUTBOX_TABLE

    env.reset_outbox()
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {OUTBOX_TABLE} (task_id, task_name, payload, options, status,
                available_at, attempts, last_error, locked_until, created_at, published_at)
            SELECT 'parked-' || g, 'bench.outbox_noop', '[[1], {{}}, {{}}]', '{{}}', 'pending',
                now() + interval '1 day' + g * interval '1 ms', 0, '', NULL, now(), NULL
            FROM generate_series(1, %s) AS g
            """,
            [rows],
        )
        cursor.execute(f"VACUUM ANALYZE {OUTBOX_TABLE}")


def claim_plan() -> str:
    """``EXPLAIN ANALYZE`` of an empty sweep's claim (rolled back: it would lease rows)."""
    from django.db import connection, transaction

    from celery_outbox.clock import utcnow
    from django_outbox.store.statements import _CLAIM_DUE

    now = utcnow()
    params = [now, now, now, 500, now, None, None]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY ON) " + _CLAIM_DUE, params)
        plan = "\n".join(line for (line,) in cursor.fetchall())
        transaction.set_rollback(True)
    return plan


def empty_sweeps(parked: int) -> dict[str, Any]:
    """Times of :data:`EMPTY_SWEEPS` sweeps over ``parked`` parked rows (ms), and the plan."""
    from benchmarks.sweep import sweeper

    seed_parked(parked)
    sweep = sweeper()
    times = []
    for _ in range(EMPTY_SWEEPS):
        started = time.perf_counter()
        report = sweep.sweep()
        times.append((time.perf_counter() - started) * 1000)
        if report.published:
            raise RuntimeError(f"an empty sweep published {report.published} rows")
    plan = claim_plan()
    env.reset_outbox()
    return {"times": times, "plan": plan}


def run(*, rows: int, parked: int) -> list[dict[str, Any]]:
    """One row per number of sweepers, and the empty sweep's row."""
    result = []
    sweepers_round(min(rows, 500), 1)  # warm-up
    for processes in PROCESSES:
        measured = sweepers_round(rows, processes)
        result.append(
            {
                "benchmark": "sweep scale",
                "case": f"{rows} rows, {processes} sweeper process(es)",
                "unit": "rows/s",
                "tasks": rows,
                "rounds": 1,
                "ours": measured["rate"],
                "cpu_share": measured["cpu_share"],
                "cores": os.cpu_count(),
            }
        )
    empty = empty_sweeps(parked)
    result.append(
        {
            "benchmark": "sweep scale",
            "case": f"empty sweep, {parked} parked rows, none due",
            "unit": "ms",
            "tasks": EMPTY_SWEEPS,
            "rounds": 1,
            "ours": median(empty["times"]),
            "p50": median(empty["times"]),
            "p99": percentile(empty["times"], 0.99),
            "target": EMPTY_TARGET_MS,
            "plan": empty["plan"],
        }
    )
    return result
