"""The store's part in waking the relay (``celery_outbox.store.base``) on every store.

``next_due``: the earliest due time of a pending row after a given instant (the relay
sleeps until then); ``listen_connector``: a connection to LISTEN on where the database
has ``NOTIFY`` (PostgreSQL), ``None`` elsewhere (the relay polls). The trigger's
notifications themselves: ``tests/integration/test_relay_notify.py``.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from celery_outbox.store.base import CHANNEL
from celery_outbox.store.records import Claim
from tests.contract.factories import NOW, new_message
from tests.contract.harness import Harness

HOUR = timedelta(hours=1)
#: The stores on PostgreSQL (the Django tests run on it).
POSTGRESQL = {"sqlalchemy-postgresql", "django"}


def add(h: Harness, **fields: object) -> int:
    row_id = h.store.add(new_message(**fields))
    assert row_id is not None
    return row_id


def test_nothing_is_due_later_in_an_empty_outbox(harness: Harness) -> None:
    assert harness.store.next_due(after=NOW) is None


def test_the_earliest_pending_row_due_after_the_instant_is_next(harness: Harness) -> None:
    add(harness, task_id="due-now", available_at=NOW)
    add(harness, task_id="later", available_at=NOW + 2 * HOUR)
    add(harness, task_id="sooner", available_at=NOW + HOUR)
    assert harness.store.next_due(after=NOW) == NOW + HOUR
    assert harness.store.next_due(after=NOW + HOUR) == NOW + 2 * HOUR
    assert harness.store.next_due(after=NOW - HOUR) == NOW


def test_rows_that_are_not_pending_are_never_due(harness: Harness) -> None:
    row_id = add(harness, available_at=NOW + HOUR)
    claim: Claim = harness.store.claim([row_id], now=NOW + HOUR, lease_until=NOW + 2 * HOUR)
    assert claim.messages
    harness.store.record_failure(claim, [row_id], error="gave up", retry_at=None)
    assert harness.store.next_due(after=NOW) is None


def test_only_postgresql_offers_a_connection_to_listen_on(
    harness: Harness, request: pytest.FixtureRequest
) -> None:
    connect = harness.store.listen_connector()
    if request.node.callspec.id not in POSTGRESQL:
        assert connect is None
        return
    assert connect is not None
    connection = connect()
    try:
        connection.autocommit = True
        cursor = connection.cursor()
        cursor.execute(f'LISTEN "{CHANNEL}"')  # a live connection of its own
        cursor.close()
    finally:
        connection.close()
