"""Where the outbox table's rows lie on PostgreSQL, for the fill-factor tests of both
stores (``celery_outbox.table_storage``): a claim's lease stays on its row's page."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from celery_outbox.records import OUTBOX_TABLE

#: Rows seeded: pages' worth of small rows (a full page would leave no room for a lease).
ROWS = 300
#: Rows one claim leases.
CLAIMED = 100

#: ``ROWS`` pending rows due an hour ago, created as long ago (past any grace).
SEED = f"""INSERT INTO {OUTBOX_TABLE} (task_id, task_name, payload, options, status,
    available_at, attempts, last_error, locked_until, created_at)
SELECT 'paged-' || g, 'tests.noop', '[[], {{}}]', '{{}}', 'pending',
    now() - interval '1 hour', 0, '', NULL, now() - interval '1 hour'
FROM generate_series(1, {ROWS}) AS g"""

#: The table's storage parameters (``None`` when all are the defaults).
RELOPTIONS = f"SELECT reloptions FROM pg_class WHERE oid = '{OUTBOX_TABLE}'::regclass"

#: Each row's id and the page its current version lies on.
PAGES = f"SELECT id, (ctid::text::point)[0]::bigint FROM {OUTBOX_TABLE}"

#: Runs one statement, returning its rows.
Query = Callable[[str], Sequence[Sequence[Any]]]


def pages(query: Query) -> dict[int, int]:
    """Each row's id -> the page it lies on."""
    return {int(row_id): int(page) for row_id, page in query(PAGES)}


def moved(before: dict[int, int], after: dict[int, int], ids: Sequence[int]) -> list[int]:
    """Those of ``ids`` whose row is on another page ``after`` than ``before``."""
    return [row_id for row_id in ids if before[row_id] != after[row_id]]


#: A claim leases every row of the pages it reads (rows in the order written); the half
#: page left holds nearly as many new versions as the page has rows (less the new line
#: pointers): a few move. On a table filled to the default 100, every lease moves.
MOVED_AT_MOST = CLAIMED // 10
