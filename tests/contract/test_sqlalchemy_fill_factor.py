"""The SQLAlchemy store's outbox table leaves half of each page free on PostgreSQL, so a
claim's lease is an update on the row's own page (``celery_outbox.store.schema``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine

from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore
from celery_outbox.store.schema import FILLFACTOR
from tests import table_pages

pytestmark = pytest.mark.postgres


def query(engine: Engine) -> table_pages.Query:
    def run(statement: str) -> Sequence[Sequence[Any]]:
        with engine.begin() as conn:
            result = conn.execute(text(statement))
            return [tuple(row) for row in result] if result.returns_rows else []

    return run


def test_the_table_is_created_with_the_fill_factor(pg_engine: Engine) -> None:
    ((options,),) = query(pg_engine)(table_pages.RELOPTIONS)
    assert options == [f"fillfactor={FILLFACTOR}"]


def test_a_claims_lease_stays_on_its_rows_page(pg_engine: Engine) -> None:
    store = SQLAlchemyOutboxStore(engine=pg_engine)
    assert len(table_pages.claim_moves(store, query(pg_engine))) <= table_pages.MOVED_AT_MOST
