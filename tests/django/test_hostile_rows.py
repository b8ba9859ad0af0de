"""Hostile rows through ``manage.py outbox sweep`` and the admin's "publish now".

Rows are written straight into the table (issue 13 #1 and #11): a row claiming pickle on
a JSON-only app, a zlib bomb and a row of an unregistered task all end ``failed`` with
the reason, and none is decoded, inflated or published. Runs on PostgreSQL, and on
SQLite with ``OUTBOX_TEST_DJANGO_DB=sqlite``.
"""

from __future__ import annotations

import io
import tracemalloc
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import transaction

from django_outbox.admin import actions as admin_actions
from django_outbox.models import OutboxMessage
from tests.django.admin_app import APP_PATH, dispatch_row
from tests.hostile import pickle_row, zlib_bomb

pytestmark = pytest.mark.django_db(transaction=True)

#: How much a sweep of a bomb may allocate (the bomb inflates to 256 MiB).
ALLOCATION_LIMIT = 32 * 1024 * 1024


@pytest.fixture(autouse=True)
def _outbox_app(settings: Any) -> None:
    settings.DJANGO_OUTBOX_CELERY_APP = APP_PATH


def hostile_row(make: Callable[[dict[str, Any]], tuple[str, dict[str, Any]]]) -> OutboxMessage:
    """A committed pending row of ``record`` whose body ``make`` replaces (never published)."""
    with transaction.atomic():
        row: OutboxMessage = dispatch_row(countdown=3600)  # parked: no on-commit publish
    row.payload, row.options = make(dict(row.options))
    row.available_at = row.created_at + timedelta(microseconds=1)  # parked, due now
    row.save(update_fields=["payload", "options", "available_at"])
    return row


def sweep() -> str:
    out = io.StringIO()
    call_command("outbox", "sweep", stdout=out)
    return out.getvalue()


def publish_now() -> None:
    admin_actions.publish_messages_now(OutboxMessage.objects.all())


def state(row: OutboxMessage) -> tuple[str, str]:
    row.refresh_from_db()
    return row.status, row.last_error


@pytest.mark.parametrize("run", [sweep, publish_now], ids=["outbox-sweep", "publish-now"])
def test_a_pickle_row_is_failed_without_being_unpickled(tmp_path: Path, run: Any) -> None:
    marker = tmp_path / "pwned"
    row = hostile_row(lambda options: pickle_row(options, marker))

    run()

    assert not marker.exists(), "a row the app does not accept was unpickled"
    status, reason = state(row)
    assert status == "failed"
    assert "'application/x-python-serialize' is not accepted" in reason


def test_outbox_sweep_fails_a_zlib_bomb_without_inflating_it() -> None:
    row = hostile_row(zlib_bomb)

    tracemalloc.start()
    try:
        sweep()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert peak < ALLOCATION_LIMIT, f"the sweep allocated {peak} bytes"
    status, reason = state(row)
    assert status == "failed"
    assert "inflates beyond outbox_max_payload_bytes" in reason


def test_publish_now_fails_a_row_of_an_unregistered_task_instead_of_publishing_it() -> None:
    with transaction.atomic():
        row = dispatch_row(countdown=3600)
    OutboxMessage.objects.filter(pk=row.pk).update(task_name="nobody.registered")

    publish_now()

    status, reason = state(row)
    assert status == "failed"
    assert "'nobody.registered' is not registered" in reason
