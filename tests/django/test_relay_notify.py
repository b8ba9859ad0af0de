"""The relay loop on the Django store: the migration's trigger and the NOTIFY wake-up.

The loop polls every :data:`POLL` seconds, beyond the deadline: the row is published in
time only because the trigger's ``NOTIFY`` woke the loop. The wake-up's fallbacks (LISTEN
refused, a killed backend, SQLite): ``tests/integration/test_relay_notify.py``.
"""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, connections

from celery_outbox.clock import utcnow
from celery_outbox.config import OutboxConfig
from celery_outbox.dispatch.envelope import build_message
from celery_outbox.relay.relay import Relay
from celery_outbox.relay.sweeper import Sweeper
from celery_outbox.store.base import CHANNEL, NOTIFY_TRIGGER
from django_outbox.models import OutboxMessage
from django_outbox.store import DjangoOutboxStore
from tests.django.celery_app import RECORD, create_app
from tests.integration.sweep_support import drain_task_ids
from tests.worker import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

POLL = 60.0
DEADLINE = 20.0


def on_postgresql() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("NOTIFY is PostgreSQL's")


def listeners() -> set[int]:
    """The backends of this database whose last statement was the relay's LISTEN."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query = %s",
            [f'LISTEN "{CHANNEL}"'],
        )
        return {pid for (pid,) in cursor.fetchall()}


def test_the_migration_creates_the_trigger_on_postgresql() -> None:
    on_postgresql()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tgrelid::regclass::text FROM pg_trigger WHERE tgname = %s", [NOTIFY_TRIGGER]
        )
        assert cursor.fetchall() == [(OutboxMessage._meta.db_table,)]


def test_a_notify_wakes_the_relay_long_before_its_poll(redis_url: str, queue_name: str) -> None:
    on_postgresql()
    app = create_app(redis_url, queue_name, outbox_publish_grace=0, outbox_beat_schedule=False)
    store, config = DjangoOutboxStore(), OutboxConfig.from_celery(app)
    relay = Relay(app, store=store, config=config)
    sweeper = Sweeper(app=app, store=store, relay=relay, config=config)
    stop = threading.Event()

    def run() -> Any:
        try:
            sweeper.run(stop, POLL)
        finally:
            connections.close_all()

    # A listener left by an earlier relay on this database is not this one's.
    before = listeners()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: listeners() - before, timeout=DEADLINE, what="the relay's LISTEN")
        message = build_message(
            app.tasks[RECORD],
            (),
            {},
            task_id="woken",
            options={},
            now=utcnow(),
            park_after=timedelta(seconds=30),
            max_bytes=None,
        )
        store.add(message)  # committed at once, with no on-commit publisher
        try:
            wait_for(lambda: not OutboxMessage.objects.exists(), timeout=DEADLINE, what="NOTIFY")
        except TimeoutError as exc:  # say where the row stands
            fields = ("status", "attempts", "last_error", "locked_until", "created_at")
            rows = list(OutboxMessage.objects.values(*fields, "available_at"))
            raise AssertionError(f"not published: {rows}; listeners {listeners()}") from exc
    finally:
        stop.set()
        thread.join(timeout=30)
        app.close()
    assert drain_task_ids(redis_url, queue_name) == Counter({"woken": 1})
