"""Where the outbox table's rows lie on PostgreSQL, for the fill-factor tests of both
stores (``celery_outbox.store.schema``): a claim's lease stays on its row's page.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from celery_outbox.store.base import OutboxStore
from celery_outbox.store.records import OUTBOX_TABLE
from tests.outbox_seed import pending_rows

#: Rows seeded: pages' worth of small rows (a full page would leave no room for a lease).
ROWS = 300
#: Rows one claim leases.
CLAIMED = 100

#: ``ROWS`` pending rows, claimable at once.
SEED = pending_rows(ROWS, "paged-")

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


def claim_moves(store: OutboxStore, query: Query) -> list[int]:
    """Seed :data:`SEED`, let ``store`` claim :data:`CLAIMED` rows; the ids of those of
    them whose lease put them on another page.
    """
    query(SEED)
    before = pages(query)
    now = store.now()
    claim = store.claim_due(
        now=now, created_before=now, limit=CLAIMED, lease_until=now + timedelta(seconds=60)
    )
    ids = [m.id for m in claim.messages]
    assert len(ids) == CLAIMED
    return moved(before, pages(query), ids)
