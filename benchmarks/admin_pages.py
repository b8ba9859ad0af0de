"""Admin page render times over large tables on PostgreSQL (issue 19).

The outbox table holds ``rows`` rows (85 % published rows kept by
``outbox_keep_published``, published over the last two days; 14 % parked retries due over
the next month; 1 % failed; 0.1 % due), beside ``letters`` dead letters (90 % ``dead``,
failed over the last week, 20 tasks x 5 exception types, a 1.5 kB traceback each) and
``workflows`` workflows (created one a second, newest first: 5 % failed, 5 % running, the
rest succeeded) and ``completed`` completed atomic tasks (one per run, kept
``outbox_keep_completed``, 7 days: completed over the last 7 days, a uuid task id each,
half with a small result; the newest :data:`WORKFLOW_STEPS` per workflow are the
workflows' done steps); the parked rows and half the dead letters are steps of the first
:data:`STEPPED` workflows (the timed one, ``root-1``, has more pending steps than its page
shows), all written by ``INSERT ... SELECT generate_series`` (not timed),
then ``VACUUM ANALYZE``. A superuser then gets each admin page through Django's test
client (the whole request: middleware, session, queries, template), with the overview's
publish chart on (``outbox_keep_published`` is set for the run).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any

from benchmarks import env
from benchmarks.stats import median, percentile

#: Shares of the outbox rows (the rest are published).
PARKED, FAILED, DUE = 0.14, 0.01, 0.001
#: Renders timed per page and round (after two untimed ones).
RENDERS = 10
#: The issue's bound on one page render, in milliseconds.
TARGET_MS = 300.0
#: Share of the dead letters still ``dead``.
DEAD_SHARE = 0.9
#: Workflows with steps: the parked rows' (and every other dead letter's) root ids.
STEPPED = 1000
#: Completed atomic steps per workflow (a seeded workflow has ``steps_total`` 3).
WORKFLOW_STEPS = 3


def seed_statements(rows: int, letters: int, completed: int, workflows: int) -> list[str]:
    """SQL writing the rows of the module's docstring."""
    parked, failed, due = int(rows * PARKED), int(rows * FAILED), max(1, int(rows * DUE))
    published = rows - parked - failed - due
    spread = max(1, published)
    return [
        _outbox(
            published,
            "published",
            "kept",
            f"now() - interval '2 days' + g * (interval '2 days' / {spread})",
            f"now() - interval '2 days' + g * (interval '2 days' / {spread}) + interval '20 ms'",
        ),
        _outbox(
            parked,
            "pending",
            "parked",
            "now() + (1 + g % 43200) * interval '1 minute'",
            "NULL",
            f"jsonb_build_object('headers', jsonb_build_object('retries', 2, "
            f"'root_id', 'root-' || (1 + g % {STEPPED})))",
        ),
        _outbox(failed, "failed", "failed", "now() - interval '1 day'", "NULL"),
        _outbox(due, "pending", "due", "now() - interval '1 second'", "NULL"),
        f"""
        INSERT INTO celery_outbox_deadletter (task_id, task_name, args, kwargs, options,
            exception_type, exception_message, traceback, retries, first_failed_at,
            failed_at, status, requeued_at, requeued_by, requeued_task_id)
        SELECT 'letter-' || g, 'shop.tasks.task_' || (g % 20),
            ('[' || g || ', "order"]')::jsonb, '{{"attempt": 3}}',
            CASE WHEN g % 2 = 0 THEN jsonb_build_object('queue', 'celery', 'canvas',
                jsonb_build_object('root_id', 'root-' || (1 + g / 2 % {STEPPED})))
                ELSE '{{"queue": "celery"}}' END,
            'shop.errors.Error' || (g % 7 % 5),
            'order ' || g || ' failed: the provider answered 503 Service Unavailable',
            repeat('  File "shop/tasks.py", line 42, in run\\n    provider.send()\\n', 25),
            3, now() - interval '7 days' + g * (interval '7 days' / {letters}),
            now() - interval '7 days' + g * (interval '7 days' / {letters}),
            CASE WHEN g % 10 < {int(DEAD_SHARE * 10)} THEN 'dead' ELSE 'requeued' END,
            NULL, '', ''
        FROM generate_series(1, {letters}) AS g
        """,
        f"""
        INSERT INTO outbox_workflow (root_id, name, status, steps_total, steps_done,
            created_at, finished_at, failed_task_id)
        SELECT 'root-' || g, 'shop.checkout', (ARRAY['succeeded', 'running', 'failed'])[
            CASE WHEN g % 20 = 0 THEN 3 WHEN g % 10 = 0 THEN 2 ELSE 1 END],
            3, 3, now() - g * interval '1 s', now(), NULL
        FROM generate_series(1, {max(1, workflows)}) AS g
        """,
        _completed(completed, workflows=max(1, workflows)),
    ]


def _completed(count: int, *, workflows: int) -> str:
    # the newest rows are the workflows' steps (the workflows were created in the last
    # ``workflows`` seconds); md5(...)::uuid gives each a uuid task id, as Celery's are
    steps = min(count, WORKFLOW_STEPS * workflows)
    spread = max(1, count)
    return f"""
    INSERT INTO celery_outbox_completedtask (task_id, task_name, completed_at, result, root_id)
    SELECT md5('done-' || g)::uuid::text, 'shop.tasks.charge_' || (g % 10),
        now() - interval '7 days' + g * (interval '7 days' / {spread}),
        CASE WHEN g % 2 = 0 THEN '{{"order": ' || g || ', "charged": true}}' END,
        CASE WHEN g > {count - steps} THEN 'root-' || (1 + ({count} - g) % {workflows}) END
    FROM generate_series(1, {count}) AS g
    """


def _outbox(
    count: int,
    status: str,
    prefix: str,
    available_at: str,
    published_at: str,
    options: str = """'{"headers": {"retries": 2}}'""",
) -> str:
    return f"""
    INSERT INTO celery_outbox_message (task_id, task_name, payload, options, status,
        available_at, attempts, last_error, locked_until, created_at, published_at)
    SELECT '{prefix}-' || g, 'shop.tasks.task_' || (g % 20), '[[1], {{}}, {{}}]',
        {options}, '{status}', {available_at}, 0, '', NULL,
        now() - interval '2 days', {published_at}
    FROM generate_series(1, {count}) AS g
    """


def seed(rows: int, letters: int, completed: int, workflows: int) -> None:
    """Empty the tables and write the rows (autocommit), then ``VACUUM ANALYZE``."""
    from django.db import connection

    from celery_outbox.store.records import (
        COMPLETED_TABLE,
        DEAD_LETTER_TABLE,
        OUTBOX_TABLE,
        WORKFLOW_TABLE,
    )

    env.reset_outbox()
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {WORKFLOW_TABLE}, {COMPLETED_TABLE}")
        for statement in seed_statements(rows, letters, completed, workflows):
            cursor.execute(statement)
        for table in (OUTBOX_TABLE, DEAD_LETTER_TABLE, WORKFLOW_TABLE, COMPLETED_TABLE):
            cursor.execute(f"VACUUM ANALYZE {table}")


def pages() -> dict[str, str]:
    """``{page: URL}`` of every admin page timed."""
    from django.urls import reverse

    from django_outbox.models import CompletedTask, DeadLetter, OutboxMessage, Workflow

    letter = DeadLetter.objects.filter(status="dead").order_by("-id").only("id").first()
    # the row due last: no sweep publishes (and deletes) it while the pages are timed
    pending = OutboxMessage.objects.filter(status="pending")
    row = pending.order_by("-available_at").only("id").first()
    workflow = Workflow.objects.filter(root_id="root-1").only("id").first()
    # the newest: the last a sweep would purge
    done = CompletedTask.objects.order_by("-id").only("id").first()
    if letter is None or row is None or workflow is None or done is None:
        raise RuntimeError("the seed wrote no dead letter, pending row, workflow or completed task")
    admin = "admin:django_outbox_"
    return {
        "overview": reverse(admin + "overview_changelist"),
        "dead-letter list": reverse(admin + "deadletter_changelist"),
        "dead-letter page": reverse(admin + "deadletter_change", args=[letter.pk]),
        "outbox message list": reverse(admin + "outboxmessage_changelist"),
        "outbox message page": reverse(admin + "outboxmessage_change", args=[row.pk]),
        "workflow list": reverse(admin + "workflow_changelist"),
        "workflow page": reverse(admin + "workflow_change", args=[workflow.pk]),
        "completed task list": reverse(admin + "completedtask_changelist"),
        "completed task page": reverse(admin + "completedtask_change", args=[done.pk]),
    }


def render_times(get: Callable[[str], Any], url: str, renders: int) -> list[float]:
    """Milliseconds of each of ``renders`` GETs of ``url`` (after two untimed ones)."""
    for _ in range(2):
        _check(get(url), url)
    times = []
    for _ in range(renders):
        started = time.perf_counter()
        response = get(url)
        times.append((time.perf_counter() - started) * 1000)
        _check(response, url)
    return times


def _check(response: Any, url: str) -> None:
    if response.status_code != 200:
        raise RuntimeError(f"GET {url}: {response.status_code}\n{response.content[:2000]!r}")


def run(
    *, rows: int, letters: int, completed: int, workflows: int, rounds: int
) -> list[dict[str, Any]]:
    """One result row per page: the p50 and p99 of ``rounds`` x :data:`RENDERS` renders."""
    from django.contrib.auth.models import User
    from django.test import Client

    from benchmarks.app import app
    from celery_outbox.config import OutboxConfig
    from celery_outbox.state import state_of

    seed(rows, letters, completed, workflows)
    state = state_of(app)
    kept = replace(OutboxConfig.from_celery(app), keep_published=timedelta(days=7))
    previous, state.config = state.config, kept
    User.objects.filter(username="bench-admin").delete()
    user = User.objects.create_superuser("bench-admin", password=None)
    client = Client()
    client.force_login(user)
    results = []
    try:
        for page, url in pages().items():
            times: list[float] = []
            for _ in range(rounds):
                times += render_times(client.get, url, RENDERS)
            results.append(
                {
                    "benchmark": "admin pages",
                    "case": f"{page} ({rows:,} outbox rows, {letters:,} letters, "
                    f"{completed:,} completed, {workflows:,} workflows)",
                    "unit": "ms",
                    "rounds": rounds,
                    "p50": median(times),
                    "p99": percentile(times, 0.99),
                    "target": TARGET_MS,
                    "samples": {"ms": times},
                }
            )
    finally:
        state.config = previous
        user.delete()
        env.reset_outbox()
    return results
