"""Scrape cost: one scrape of the outbox gauges over a large outbox on PostgreSQL.

The outbox table holds ``rows`` rows, parked and published mixed (85 % published rows
kept by ``outbox_keep_published``, 14 % parked retries due over the next month, 1 %
failed, plus a few due rows), beside ``rows / 20`` dead letters and ``rows / 20``
workflows of every status, all written by one ``INSERT ... SELECT generate_series`` each
(not timed), then ``VACUUM ANALYZE`` as autovacuum would leave them. A scrape is
``generate_latest`` of a registry holding only :class:`~celery_outbox.metrics.OutboxCollector`
on the benchmark app's Django store: every gauge read from the database.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks import env
from benchmarks.stats import median, percentile

#: Shares of the outbox rows (the rest are published).
PARKED, FAILED, DUE = 0.14, 0.01, 0.001
#: Scrapes timed per round.
SCRAPES = 50
#: The issue's bound on one scrape, in milliseconds.
TARGET_MS = 50.0


def seed_statements(rows: int) -> list[str]:
    """SQL writing ``rows`` outbox rows (mixed), ``rows // 20`` dead letters and workflows."""
    parked, failed, due = int(rows * PARKED), int(rows * FAILED), max(1, int(rows * DUE))
    published = rows - parked - failed - due
    side = max(1, rows // 20)
    return [
        _outbox(published, "published", "now() - interval '2 days' + g * interval '1 ms'", "kept"),
        _outbox(parked, "pending", "now() + (1 + g % 43200) * interval '1 minute'", "parked"),
        _outbox(failed, "failed", "now() - interval '1 day'", "failed"),
        _outbox(due, "pending", "now() - interval '1 second'", "due"),
        f"""
        INSERT INTO celery_outbox_deadletter (task_id, task_name, args, kwargs, options,
            exception_type, exception_message, traceback, retries, first_failed_at,
            failed_at, status, requeued_at, requeued_by, requeued_task_id)
        SELECT 'letter-' || g, 'bench.flaky', '[1]', '{{}}', '{{}}', 'builtins.ValueError',
            'boom', 'Traceback', 3, now() - interval '1 day', now() - g * interval '1 s',
            (ARRAY['dead', 'requeued', 'discarded'])[1 + g % 3], NULL, '', ''
        FROM generate_series(1, {side}) AS g
        """,
        f"""
        INSERT INTO outbox_workflow (root_id, name, status, steps_total, steps_done,
            created_at, finished_at, failed_task_id)
        SELECT 'root-' || g, 'bench.chain', (ARRAY['succeeded', 'running', 'failed'])[
            CASE WHEN g % 20 = 0 THEN 3 WHEN g % 10 = 0 THEN 2 ELSE 1 END],
            3, 3, now() - interval '1 day', now(), NULL
        FROM generate_series(1, {side}) AS g
        """,
    ]


def _outbox(count: int, status: str, available_at: str, prefix: str) -> str:
    return f"""
    INSERT INTO celery_outbox_message (task_id, task_name, payload, options, status,
        available_at, attempts, last_error, locked_until, created_at, published_at)
    SELECT '{prefix}-' || g, 'bench.noop', '[[1], {{}}, {{}}]', '{{}}', '{status}',
        {available_at}, 1, '', NULL, now() - interval '2 days', NULL
    FROM generate_series(1, {count}) AS g
    """


def seed(rows: int) -> None:
    """Empty the tables and write the mixed rows (autocommit), then ``VACUUM ANALYZE``."""
    from django.db import connection

    from celery_outbox.store.records import DEAD_LETTER_TABLE, OUTBOX_TABLE, WORKFLOW_TABLE

    env.reset_outbox()
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {WORKFLOW_TABLE}")
        for statement in seed_statements(rows):
            cursor.execute(statement)
        for table in (OUTBOX_TABLE, DEAD_LETTER_TABLE, WORKFLOW_TABLE):
            cursor.execute(f"VACUUM ANALYZE {table}")


def scrape_times(scrapes: int) -> list[float]:
    """Milliseconds of each of ``scrapes`` scrapes (after two untimed ones)."""
    from prometheus_client import CollectorRegistry, generate_latest

    from benchmarks.app import app
    from celery_outbox.metrics import OutboxCollector

    registry = CollectorRegistry()
    registry.register(OutboxCollector(app))
    for _ in range(2):
        _check(generate_latest(registry))
    times = []
    for _ in range(scrapes):
        started = time.perf_counter()
        generate_latest(registry)
        times.append((time.perf_counter() - started) * 1000)
    return times


def _check(page: bytes) -> None:
    if b"celery_outbox_scrape_error 0.0" not in page or b"celery_outbox_parked " not in page:
        raise RuntimeError(f"the scrape did not read the outbox:\n{page.decode()[:2000]}")


def run(*, rows: int, rounds: int) -> list[dict[str, Any]]:
    """One result row: the p50 and p99 of ``rounds`` x :data:`SCRAPES` scrapes."""
    seed(rows)
    times: list[float] = []
    for _ in range(rounds):
        times += scrape_times(SCRAPES)
    env.reset_outbox()
    return [
        {
            "benchmark": "scrape",
            "case": f"{rows:,} outbox rows (14% parked, 85% published), {rows // 20:,} letters",
            "unit": "ms",
            "rounds": rounds,
            "p50": median(times),
            "p99": percentile(times, 0.99),
            "target": TARGET_MS,
            "samples": {"ms": times},
        }
    ]
