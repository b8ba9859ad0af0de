"""SQL writing a backlog of small pending outbox rows in one statement (any store's table)."""

from __future__ import annotations

from celery_outbox.store.records import OUTBOX_TABLE


def pending_rows(count: int, prefix: str) -> str:
    """An ``INSERT`` of ``count`` pending rows of ``tests.noop`` (task ids ``prefix`` + n),
    due and created an hour ago: past any grace, claimable at once.
    """
    return f"""INSERT INTO {OUTBOX_TABLE} (task_id, task_name, payload, options, status,
    available_at, attempts, last_error, locked_until, created_at)
SELECT '{prefix}' || g, 'tests.noop', '[[], {{}}]', '{{}}', 'pending',
    now() - interval '1 hour', 0, '', NULL, now() - interval '1 hour'
FROM generate_series(1, {count}) AS g"""
