"""The dead-letter list's time filter on 100,000 letters of the last 8 days, on PostgreSQL
(issue 19; the page's time: the ``admin_pages`` benchmark).

The filter adds ``status IN (every status)`` to its range of ``failed_at``, so the count
of a window (up to 10,000) is an index-only scan of the ``status, failed_at`` index, one
range per status, or, for a window that holds most of the table (the last 7 days: 87 % of
the letters), a sequential read under the count's ``LIMIT 10001`` that stops at its
10,001st letter (the planner's call, which its sampled statistics tip either way; CI saw
it). The page's 100 rows are read walking the primary key backwards, newest first (or,
when the planner expects few rows, along that index). Never an unbounded scan of the
table. Walking back to *older than 7 days* passes every newer letter: ~30-50 ms per
100,000 on the shared test machine, within the pages' 300 ms.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from celery_outbox.store.records import DEAD_LETTER_TABLE

pytestmark = pytest.mark.django_db(transaction=True)

LETTERS = 100_000
#: Seconds between two letters, the newest now: 100,000 of them span 8 days.
SPACING = 8 * 86_400 / LETTERS
INDEX = "celery_outbox_dl_status_failed_idx"

SEED = [
    f"""INSERT INTO {DEAD_LETTER_TABLE} (task_id, task_name, args, kwargs, options,
        exception_type, exception_message, traceback, retries, first_failed_at, failed_at,
        status, requeued_at, requeued_by, requeued_task_id)
    SELECT 'letter-' || g, 'shop.ship', '[]', '{{}}', '{{}}', 'shop.Error', 'failed',
        'traceback', 3, now(), now() - make_interval(secs => ({LETTERS} - g) * {SPACING}),
        CASE WHEN g % 20 = 0 THEN 'requeued' WHEN g % 20 = 1 THEN 'discarded' ELSE 'dead' END,
        NULL, '', ''
    FROM generate_series(1, {LETTERS}) AS g""",
    f"VACUUM ANALYZE {DEAD_LETTER_TABLE}",  # as autovacuum leaves an append-mostly table
]


def plans(admin_client: Client, window: str) -> list[str]:
    """The plans of the statements reading the window (the page's rows, their count)."""
    url = reverse("admin:django_outbox_deadletter_changelist")
    with CaptureQueriesContext(connection) as queries:
        response = admin_client.get(url, {"failed_at_within": window})
    assert response.status_code == 200
    found = []
    for query in queries.captured_queries:
        sql = query["sql"]
        if f'FROM "{DEAD_LETTER_TABLE}"' in sql and "failed_at" in sql:
            with connection.cursor() as cursor:
                cursor.execute(sql if sql.startswith("EXPLAIN") else "EXPLAIN " + sql)
                found.append("\n".join(str(row[0]) for row in cursor.fetchall()))
    return found


def unbounded_scan(plan: str) -> bool:
    """Whether ``plan`` reads the table sequentially other than under the count's
    ``LIMIT 10001`` (a read that stops at the 10,001st matching letter).
    """
    lines = plan.splitlines()
    return any(
        "Seq Scan" in line and not (n and "Limit" in lines[n - 1] and "rows=10001" in lines[n - 1])
        for n, line in enumerate(lines)
    )


def test_each_time_window_is_read_along_an_index(admin_client: Client) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("plans are PostgreSQL's")
    with connection.cursor() as cursor:
        for statement in SEED:
            cursor.execute(statement)

    found = {window: plans(admin_client, window) for window in ("1h", "24h", "7d", "older")}

    scans = {window: [p for p in found[window] if unbounded_scan(p)] for window in found}
    assert scans == {window: [] for window in found}
    counts = {
        window: "Index Only Scan using " + INDEX in p[0] or "Seq Scan" in p[0]
        for window, p in found.items()
    }
    assert counts == dict.fromkeys(found, True), found
    # The page's rows (the one plan under a LIMIT that is no count): the primary key walked
    # backwards, or the window's range of the index (the planner's call for the last hour,
    # which its sampled statistics can tip either way).
    rows = {window: [q for q in p if q.startswith("Limit")] for window, p in found.items()}
    assert {window: len(plans) for window, plans in rows.items()} == dict.fromkeys(found, 1), found
    along = {window: "Index Scan" in plans[0] for window, plans in rows.items()}
    assert along == dict.fromkeys(found, True), rows
