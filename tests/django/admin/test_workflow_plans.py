"""A workflow's page finds its pending steps and dead letters along the PostgreSQL
expression indexes of migration 0011 (``celery_outbox.store.schema``), never by reading
every pending row or every dead letter (issue 19; the time: the ``admin_pages``
benchmark).
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from celery_outbox.store.records import DEAD_LETTER_TABLE, OUTBOX_TABLE
from celery_outbox.store.schema import LETTER_ROOT_INDEX, PENDING_ROOT_INDEX
from django_outbox.models import Workflow

pytestmark = pytest.mark.django_db(transaction=True)

ROWS, LETTERS, ROOTS = 60_000, 20_000, 1_000

SEED = [
    # a third pending, the rest published; every row a step of one of ROOTS workflows
    f"""INSERT INTO {OUTBOX_TABLE} (task_id, task_name, payload, options, status,
        available_at, attempts, last_error, locked_until, created_at, published_at)
    SELECT 'row-' || g, 'shop.ship', '[[], {{}}, {{}}]',
        jsonb_build_object('headers', jsonb_build_object('root_id', 'root-' || g % {ROOTS})),
        CASE WHEN g % 3 = 0 THEN 'pending' ELSE 'published' END, now(), 0, '', NULL, now(),
        NULL
    FROM generate_series(1, {ROWS}) AS g""",
    # half the letters steps of a workflow, half plain tasks
    f"""INSERT INTO {DEAD_LETTER_TABLE} (task_id, task_name, args, kwargs, options,
        exception_type, exception_message, traceback, retries, first_failed_at, failed_at,
        status, requeued_at, requeued_by, requeued_task_id)
    SELECT 'letter-' || g, 'shop.ship', '[]', '{{}}',
        CASE WHEN g % 2 = 0 THEN jsonb_build_object('canvas',
            jsonb_build_object('root_id', 'root-' || g % {ROOTS})) ELSE '{{}}' END,
        'shop.Error', 'failed', 'traceback', 3, now(), now(), 'dead', NULL, '', ''
    FROM generate_series(1, {LETTERS}) AS g""",
    f"ANALYZE {OUTBOX_TABLE}",
    f"ANALYZE {DEAD_LETTER_TABLE}",
]


def explain(sql: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + sql)
        return "\n".join(str(row[0]) for row in cursor.fetchall())


def test_a_workflows_steps_are_read_along_the_root_id_indexes(admin_client: Client) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("plans are PostgreSQL's")
    with connection.cursor() as cursor:
        for statement in SEED:
            cursor.execute(statement)
    root = "root-6"  # rows 6, 1006, ...: pending where a multiple of 3; letters all even
    row = Workflow.objects.create(
        root_id=root,
        name="shop.checkout",
        status="running",
        steps_total=9,
        steps_done=0,
        created_at="2026-03-04T05:06:07Z",
    )

    with CaptureQueriesContext(connection) as queries:
        response = admin_client.get(reverse("admin:django_outbox_workflow_change", args=[row.pk]))

    content = response.content.decode()
    pending = [g for g in range(6, ROWS + 1, ROOTS) if g % 3 == 0]
    assert len(pending) == 20
    for g in pending:
        assert f">row-{g}</a>" in content
    assert f">row-{pending[0] + ROOTS}</a>" not in content  # published
    assert content.count(">letter-") == LETTERS // ROOTS
    keys = {OUTBOX_TABLE: "headers", DEAD_LETTER_TABLE: "canvas"}
    for index, table in (
        (PENDING_ROOT_INDEX, OUTBOX_TABLE),
        (LETTER_ROOT_INDEX, DEAD_LETTER_TABLE),
    ):
        found = [q["sql"] for q in queries.captured_queries if f'FROM "{table}"' in q["sql"]]
        assert len(found) == 1, found
        plan = explain(found[0])
        # a lookup of the root id in the index, not a walk of all its rows
        lines = [*plan.splitlines(), ""]
        scans = [n for n, line in enumerate(lines) if f"{index} " in line]
        assert scans, plan
        after = lines[scans[0] + 1]
        key = f"(options #> '{{{keys[table]},root_id}}'::text[]) = '\"{root}\"'::jsonb"
        assert "Index Cond: " in after, plan
        assert key in after, plan
        assert "Seq Scan" not in plan, plan
