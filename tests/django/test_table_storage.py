"""The migrated outbox table leaves half of each page free on PostgreSQL, so a claim's
lease is an update on the row's own page (``celery_outbox.table_storage``, migration
0012); other databases keep their defaults."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection

from celery_outbox.clock import utcnow
from celery_outbox.table_storage import FILLFACTOR
from django_outbox.store import DjangoOutboxStore
from tests import table_pages

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def on_postgresql() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("a fill factor is PostgreSQL's")


def query(statement: str) -> Sequence[Sequence[Any]]:
    with connection.cursor() as cursor:
        cursor.execute(statement)
        return cursor.fetchall()


def test_the_migration_sets_the_fill_factor() -> None:
    ((options,),) = query(table_pages.RELOPTIONS)
    assert options == [f"fillfactor={FILLFACTOR}"]


def test_a_claims_lease_stays_on_its_rows_page() -> None:
    with connection.cursor() as cursor:
        cursor.execute(table_pages.SEED)
    before = table_pages.pages(query)
    now = utcnow()
    claim = DjangoOutboxStore().claim_due(
        now=now,
        created_before=now,
        limit=table_pages.CLAIMED,
        lease_until=now + timedelta(seconds=60),
    )
    ids = [m.id for m in claim.messages]
    assert len(ids) == table_pages.CLAIMED
    assert (
        len(table_pages.moved(before, table_pages.pages(query), ids)) <= table_pages.MOVED_AT_MOST
    )
