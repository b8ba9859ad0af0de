"""The SQLAlchemy store's outbox table leaves half of each page free on PostgreSQL, so a
claim's lease is an update on the row's own page (``celery_outbox.table_storage``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine

from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore
from celery_outbox.table_storage import FILLFACTOR
from tests import table_pages

pytestmark = pytest.mark.postgres


def query(engine: Engine) -> table_pages.Query:
    def run(statement: str) -> Sequence[Sequence[Any]]:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.execute(text(statement))]

    return run


def test_the_table_is_created_with_the_fill_factor(pg_engine: Engine) -> None:
    ((options,),) = query(pg_engine)(table_pages.RELOPTIONS)
    assert options == [f"fillfactor={FILLFACTOR}"]


def test_a_claims_lease_stays_on_its_rows_page(pg_engine: Engine) -> None:
    with pg_engine.begin() as conn:
        conn.execute(text(table_pages.SEED))
    before = table_pages.pages(query(pg_engine))
    now = datetime.now(timezone.utc)
    claim = SQLAlchemyOutboxStore(engine=pg_engine).claim_due(
        now=now,
        created_before=now,
        limit=table_pages.CLAIMED,
        lease_until=now + timedelta(seconds=60),
    )
    ids = [m.id for m in claim.messages]
    assert len(ids) == table_pages.CLAIMED
    assert (
        len(table_pages.moved(before, table_pages.pages(query(pg_engine)), ids))
        <= table_pages.MOVED_AT_MOST
    )
