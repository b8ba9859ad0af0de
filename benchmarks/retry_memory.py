"""Worker memory with N pending long retries: plain ``self.retry(countdown=3600)`` vs parking.

One solo-pool worker per side (the worker process tree's RSS is read from ``/proc``).
Plain Celery re-publishes each retry with an ETA; the worker that receives an ETA message
keeps it in memory (its timer plus kombu's unacknowledged-message bookkeeping) until the
ETA, and raises its prefetch limit by one for each, so ``worker_prefetch_multiplier``
cannot bound them: the multiplier is set to 1 so that only ETA messages, never prefetched
ordinary ones, account for the growth. ``OutboxTask`` parks any wait longer than
``outbox_park_after`` (30 s) as an outbox row and acknowledges the message, so the worker
holds nothing. Bytes per pending retry = (RSS with all N pending - RSS after a warm-up
of the same tasks) / N. The database side is ``pg_total_relation_size`` of the outbox table
(heap, indexes, TOAST) per parked row.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks import env
from benchmarks.processes import Child, start_worker, wait_until

#: Tasks run before the baseline RSS is read: imports, connections and caches warmed.
#: Plain Celery's tracer keeps each retried task's stack (and billiard's copy of its
#: traceback) in a reference cycle until a full garbage collection, which grows the heap
#: for the first ~500 retries and then stays flat, so the baseline is read after 1,000.
#: ``OutboxTask`` frees it when the tracer returns (``celery_outbox.worker.runner``).
WARM_UP = 1000
#: Seconds after the last first attempt before RSS is read (the last retries reach the
#: worker or the table), and how many RSS samples are then read 0.3 s apart (the largest
#: counts). ``--quick`` waits less and samples twice: it checks the harness, not the bytes.
SETTLE = 2.0
RSS_SAMPLES = 5
#: Issue 20's bound on the worker holding the parked retries and on the sweeper
#: publishing them 500 at a time.
RSS_TARGET_MIB = 150.0
MIB = 1024 * 1024


def _outbox_table_bytes() -> int:
    from django.db import connection

    from celery_outbox.store.records import OUTBOX_TABLE

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_total_relation_size(%s)", [OUTBOX_TABLE])
        return int(cursor.fetchone()[0])


def _dispatch(plain: bool, first: int, count: int) -> None:
    from django.db import transaction

    from benchmarks.app import outbox_retry_long, plain_retry_long

    if plain:
        for i in range(first, first + count):
            plain_retry_long.apply_async((i,))
        return
    for start in range(first, first + count, 500):
        with transaction.atomic():
            for i in range(start, min(first + count, start + 500)):
                outbox_retry_long.delay(i)


def _settle(worker: Child, ran: int, *, timeout: float, settle: float, samples: int) -> int:
    """Wait until ``ran`` tasks ran once and the queue is empty; then RSS once it is stable."""
    wait_until(
        lambda: env.counter("ran") >= ran and env.queue_length() == 0,
        timeout=timeout,
        what=f"{ran} first attempts",
    )
    time.sleep(settle)  # the last retries reach the worker (plain) or the table (outbox)
    rss = []
    for _ in range(samples):
        rss.append(worker.rss_bytes())
        time.sleep(0.3)
    return max(rss)


def _side(
    plain: bool, retries: int, warm_up: int, *, settle: float, samples: int
) -> dict[str, float]:
    env.reset_outbox()
    env.purge_broker()
    worker = start_worker(pool="solo", concurrency=1, env={"BENCH_PREFETCH": "1"})
    try:
        table_before = _outbox_table_bytes()
        _dispatch(plain, 0, warm_up)
        before = _settle(worker, warm_up, timeout=120, settle=settle, samples=samples)
        _dispatch(plain, warm_up, retries)
        timeout = 60 + retries * 0.05
        after = _settle(worker, warm_up + retries, timeout=timeout, settle=settle, samples=samples)
        if not plain:  # every retry parked: its row is written right after its attempt
            wait_until(lambda: _parked_rows() >= warm_up + retries, timeout=30, what="parked rows")
        rows = _parked_rows()
        result = {
            "rss_before": before,
            "rss_after": after,
            "bytes_per_retry": (after - before) / retries,
            "parked_rows": rows,
        }
        if not plain:
            if rows != warm_up + retries:
                raise RuntimeError(f"{rows} parked rows, expected {warm_up + retries}")
            result["db_bytes_per_row"] = (_outbox_table_bytes() - table_before) / rows
            worker.stop()  # the rows are due below: no worker runs (and re-parks) them
            result["sweeper_rss_peak"] = _sweeper_peak(rows)
        return result
    finally:
        worker.stop()
        env.purge_broker()
        env.reset_outbox()


def _sweeper_peak(rows: int) -> float:
    """Make the parked rows due, then sweep them all with ``outbox sweep`` (batches of
    ``outbox_sweep_batch_size``, 500), as often as it takes; its largest RSS, sampled
    every 20 ms. Every row must reach the queue.
    """
    import sys

    from django.db import connection

    from celery_outbox.store.records import OUTBOX_TABLE

    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {OUTBOX_TABLE} SET available_at = now() - interval '1 minute', "
            "created_at = now() - interval '1 hour'"
        )
    argv = [sys.executable, "-m", "django", "outbox", "sweep"]
    peak = 0
    while _parked_rows():
        sweep = Child(argv, env={"DJANGO_SETTINGS_MODULE": "benchmarks.settings"}, ready=None)
        try:
            while sweep.process.poll() is None:
                peak = max(peak, sweep.rss_bytes())
                time.sleep(0.02)
            if sweep.process.returncode:
                raise RuntimeError(f"outbox sweep failed:\n{sweep.log_text()[-3000:]}")
        finally:
            sweep.stop()
    if env.queue_length() != rows:
        raise RuntimeError(f"{env.queue_length()} messages in the queue, expected {rows}")
    return float(peak)


def _parked_rows() -> int:
    from django_outbox.models import OutboxMessage

    return int(OutboxMessage.objects.filter(status="pending").count())


def run(
    *, retries: int, warm_up: int = WARM_UP, settle: float = SETTLE, samples: int = RSS_SAMPLES
) -> list[dict[str, Any]]:
    """One result row: worker bytes per pending retry, plain ETA vs parked.

    ``warm_up`` tasks run before the baseline (``WARM_UP`` for a measurement; ``--quick``
    runs fewer, and settles and samples less, as a harness check).
    """
    plain = _side(True, retries, warm_up, settle=settle, samples=samples)
    ours = _side(False, retries, warm_up, settle=settle, samples=samples)
    return [
        {
            "benchmark": "retry memory",
            "case": f"{retries} pending retries",
            "unit": "worker bytes/retry",
            "tasks": retries,
            "rounds": 1,
            "plain": plain["bytes_per_retry"],
            "ours": ours["bytes_per_retry"],
            # Lower is better: how many times less memory a parked retry takes.
            "ratio": plain["bytes_per_retry"] / max(ours["bytes_per_retry"], 1.0),
            "target": 50.0,
            "db_bytes_per_row": ours.get("db_bytes_per_row"),
            "samples": {"plain": plain, "ours": ours},
        },
        {
            "benchmark": "retry memory",
            "case": f"{warm_up + retries} parked: worker RSS, then the sweeper's peak",
            "unit": "MiB",
            "tasks": warm_up + retries,
            "rounds": 1,
            "worker_mib": ours["rss_after"] / MIB,
            "sweeper_peak_mib": ours["sweeper_rss_peak"] / MIB,
            "value": max(ours["rss_after"], ours["sweeper_rss_peak"]) / MIB,
            "target": RSS_TARGET_MIB,
        },
    ]
