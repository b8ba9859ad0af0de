"""The migrated outbox table leaves half of each page free on PostgreSQL, so a claim's
lease is an update on the row's own page (``celery_outbox.store.schema``, migration
0012); other databases keep their defaults.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from django.db import connection

from celery_outbox.store.schema import FILLFACTOR
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
        return cursor.fetchall() if cursor.description else []


def test_the_migration_sets_the_fill_factor() -> None:
    ((options,),) = query(table_pages.RELOPTIONS)
    assert options == [f"fillfactor={FILLFACTOR}"]


def test_a_claims_lease_stays_on_its_rows_page() -> None:
    moved = table_pages.claim_moves(DjangoOutboxStore(), query)
    assert len(moved) <= table_pages.MOVED_AT_MOST
