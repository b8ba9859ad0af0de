"""Peak memory of publishing large rows: a sweep of N rows, and one transaction of N dispatches.

``python -m benchmarks.payload_memory [--rows 99] [--size 4000000] [--json PATH]``

Each case runs in a fresh process (Django store on PostgreSQL, Redis broker: the
``benchmarks`` environment) and reports how far its resident set (``VmHWM`` minus the
RSS before the measured step) and its Python heap (``tracemalloc`` peak) grew. Two
settings are compared:

* ``unbounded``: ``outbox_sweep_batch_bytes`` at its maximum (4 GiB), which is how claims
  behaved before the byte budget existed (a batch held ``outbox_sweep_batch_size`` rows,
  whatever their size);
* ``bounded``: the default budget (16 MiB).

The sweep's rows are written with SQL (``repeat()`` on the server), so seeding costs the
measured process nothing. The transaction case dispatches ``outbox_noop.delay(big)``
``N`` times in one ``atomic()`` block: the rows it wrote are held until its commit by
design; what is measured beyond them is the publish after commit.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

from benchmarks import env

#: Default payload characters of one row: "4 MB", below outbox_max_payload_bytes (4 MiB).
SIZE = 4_000_000
#: ``outbox_sweep_batch_bytes`` of each side.
BUDGETS = {"unbounded": 4 * 1024**3, "bounded": 16 * 1024 * 1024}
CASES = ("sweep", "transaction")
MIB = 1024 * 1024


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _seed(rows: int, size: int) -> None:
    """``rows`` due rows of ``outbox_noop`` with a ``size``-character argument, via SQL."""
    from django.db import connection, transaction

    from benchmarks.app import outbox_noop
    from celery_outbox.store.records import OUTBOX_TABLE

    # One template row, built as .delay() builds it, deleted before its commit publishes it.
    with transaction.atomic(), connection.cursor() as cursor:
        outbox_noop.delay("TEMPLATE")
        cursor.execute(f"SELECT payload, options, task_name FROM {OUTBOX_TABLE}")
        payload, options, task_name = cursor.fetchone()
        cursor.execute(f"DELETE FROM {OUTBOX_TABLE}")
    with connection.cursor() as cursor:
        head, tail = payload.split("TEMPLATE")
        cursor.execute(
            f"INSERT INTO {OUTBOX_TABLE} (task_id, task_name, payload, options, status, "
            "available_at, attempts, last_error, created_at) "
            "SELECT 'payload-memory-' || g, %s, %s || repeat('x', %s) || %s, "
            "jsonb_set(%s::jsonb, '{headers,id}', to_jsonb('payload-memory-' || g)), "
            "'pending', now() - interval '1 hour', 0, '', now() - interval '1 hour' "
            "FROM generate_series(1, %s) g",
            [task_name, head, size, tail, options, rows],
        )


def _child(case: str, rows: int, size: int, budget: int) -> dict[str, Any]:
    env.setup_django()
    from django.db import transaction

    from benchmarks.app import app, outbox_noop
    from celery_outbox.config import OutboxConfig
    from celery_outbox.registry import store_for
    from celery_outbox.relay.relay import relay_for
    from celery_outbox.relay.sweeper import Sweeper

    app.conf.outbox_sweep_batch_bytes = budget
    if case == "sweep":
        app.conf.outbox_publish_grace = 0.0
    config = OutboxConfig.from_celery(app)
    relay_for(app).producers.connect()  # connected before the baseline: not part of the peak
    big = "x" * size
    baseline = _status_kib("VmRSS")
    tracemalloc.start()
    started = time.perf_counter()
    if case == "sweep":
        sweeper = Sweeper(app=app, store=store_for(app), relay=relay_for(app), config=config)
        done = sweeper.sweep().published
    else:
        with transaction.atomic():
            for _ in range(rows):
                outbox_noop.delay(big)
    seconds = time.perf_counter() - started
    heap = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    if case != "sweep":
        from django_outbox.store.transactions import settle

        settle()  # the published rows' DELETE runs on a thread, a moment after the commit
        done = rows - int(_pending())
    return {
        "published": done,
        "seconds": seconds,
        "rss_growth": (_status_kib("VmHWM") - baseline) * 1024,
        "heap_peak": heap,
    }


def _pending() -> int:
    from django_outbox.models import OutboxMessage

    return int(OutboxMessage.objects.filter(status="pending").count())


def _measure(case: str, side: str, rows: int, size: int) -> dict[str, Any]:
    env.reset_outbox()
    env.purge_broker()
    if case == "sweep":
        _seed(rows, size)
    argv = [sys.executable, "-m", "benchmarks.payload_memory", "--child", case]
    argv += ["--rows", str(rows), "--size", str(size), "--budget", str(BUDGETS[side])]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{case}/{side} failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        env.purge_broker()
        env.reset_outbox()
    if result["published"] != rows:
        raise RuntimeError(f"{case}/{side}: {result['published']} of {rows} rows published")
    return result


def run(*, rows: int, size: int) -> list[dict[str, Any]]:
    """One result row per case: peak growth unbounded (as before) vs bounded."""
    env.setup_django()
    results = []
    for case in CASES:
        sides = {side: _measure(case, side, rows, size) for side in BUDGETS}
        results.append(
            {
                "benchmark": "payload memory",
                "case": f"{case}: {rows} rows of {size / 1e6:g} MB",
                "unit": "peak RSS growth (MiB)",
                "tasks": rows,
                "rounds": 1,
                "unbounded": sides["unbounded"]["rss_growth"] / MIB,
                "bounded": sides["bounded"]["rss_growth"] / MIB,
                "heap_unbounded": sides["unbounded"]["heap_peak"] / MIB,
                "heap_bounded": sides["bounded"]["heap_peak"] / MIB,
                "samples": sides,
            }
        )
    return results


def main(argv: list[str] | None = None) -> None:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.payload_memory")
    parser.add_argument("--rows", type=int, default=99)
    parser.add_argument("--size", type=int, default=SIZE, help="payload characters per row")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--child", choices=CASES, help=argparse.SUPPRESS)
    parser.add_argument("--budget", type=int, default=BUDGETS["bounded"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child, args.rows, args.size, args.budget)))
        return
    results = run(rows=args.rows, size=args.size)
    for row in results:
        print(
            f"{row['case']:<40} unbounded {row['unbounded']:8.1f} MiB (heap "
            f"{row['heap_unbounded']:7.1f})   bounded {row['bounded']:8.1f} MiB (heap "
            f"{row['heap_bounded']:7.1f})"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    os.environ.setdefault("BENCH_QUEUE", f"celery-outbox-payload-memory-{os.getpid()}")
    os.environ.setdefault(
        "BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/celery_outbox_bench_payload"
    )
    main()
