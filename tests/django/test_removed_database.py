"""A database alias removed from ``DATABASES`` while ``DJANGO_OUTBOX_DATABASES`` still
lists it (bad input): every sweep entry point and ``outbox status``/``health`` name the
alias, go on with the other databases, and leave the rows of those pending (PostgreSQL,
a real broker).

The alias ``gone`` stands for the removed one: its rows are in a database this process
can no longer reach, and nothing here touches them.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connections, transaction

from celery_outbox import install_store
from celery_outbox.config import OutboxConfig
from celery_outbox.exceptions import StoreError
from celery_outbox.health import check
from celery_outbox.relay.relay import relay_for
from celery_outbox.relay.sweeper import Sweeper
from celery_outbox.store.base import PublishCallback
from celery_outbox.store.records import StoredMessage
from celery_outbox.sweep_task import sweep_app
from django_outbox.models import OutboxMessage
from django_outbox.store import DjangoOutboxStore
from tests.brokers import take_task_ids
from tests.django import outbox_command_app
from tests.django.celery_app import RECORD, create_app
from tests.django.conftest import World, close_app
from tests.django.outbox_command_app import APP_PATH

pytestmark = pytest.mark.django_db(transaction=True)

GONE = "gone"
NAMES_IT = rf"database alias '{GONE}' is not in DATABASES"


class ProducerDiedStore(DjangoOutboxStore):
    """A store whose on-commit publish never happens: the rows wait for a sweep."""

    def defer_publish(
        self, message: StoredMessage, publish: PublishCallback, *, using: str | None = None
    ) -> None:
        pass


@pytest.fixture
def app(world: World, settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Celery]:
    """The world's broker and queue, no grace, ``gone`` listed before ``default``."""
    settings.DJANGO_OUTBOX_CELERY_APP = APP_PATH
    settings.DJANGO_OUTBOX_DATABASES = [GONE, "default"]
    app = create_app(
        world.env["OUTBOX_TEST_BROKER"],
        world.queue,
        outbox_beat_schedule=False,
        outbox_publish_grace=0.0,
    )
    monkeypatch.setattr(outbox_command_app, "app", app)
    yield app
    close_app(app)


def left_behind(app: Celery, *keys: str) -> None:
    """Commit one row per key in ``default`` that no on-commit publisher sends."""
    writer = create_app(app.conf.broker_url, app.conf.task_default_queue, outbox_publish_grace=0.0)
    install_store(writer, ProducerDiedStore())
    with transaction.atomic():
        for key in keys:
            writer.tasks[RECORD].apply_async(task_id=key)
    close_app(writer)
    assert set(OutboxMessage.objects.values_list("task_id", flat=True)) >= set(keys)


def published(world: World) -> list[str]:
    return take_task_ids(world.env["OUTBOX_TEST_BROKER"], world.queue)


def test_the_beat_sweep_names_the_alias_and_sweeps_the_others(app: Celery, world: World) -> None:
    left_behind(app, "a", "b")
    with pytest.raises(StoreError, match=rf"could not sweep database\(s\) '{GONE}'.*{NAMES_IT}"):
        sweep_app(app)
    assert sorted(published(world)) == ["a", "b"]
    assert not OutboxMessage.objects.exists()


def test_the_relay_loop_keeps_sweeping_the_others(
    app: Celery, world: World, caplog: pytest.LogCaptureFixture
) -> None:
    sweeper = Sweeper(
        app=app,
        store=DjangoOutboxStore(),
        relay=relay_for(app),
        config=OutboxConfig.from_celery(app),
    )
    stop = threading.Event()

    def relay() -> None:
        try:
            sweeper.run(stop, 0.05)
        finally:
            connections.close_all()

    loop = threading.Thread(target=relay)
    loop.start()
    try:
        for batch in (("c", "d"), ("e",)):  # a second pass after the failed one
            left_behind(app, *batch)
            for _ in range(200):
                if not OutboxMessage.objects.filter(task_id__in=batch).exists():
                    break
                stop.wait(0.05)
    finally:
        stop.set()
        loop.join(timeout=30)
    assert not loop.is_alive()
    assert sorted(published(world)) == ["c", "d", "e"]
    assert f"could not sweep database '{GONE}'" in caplog.text


def test_the_sweep_command_sweeps_the_others_then_fails_naming_it(
    app: Celery, world: World
) -> None:
    left_behind(app, "f")
    out = io.StringIO()
    with pytest.raises(CommandError, match=rf"outbox sweep: database {GONE}: .*{NAMES_IT}"):
        call_command("outbox", "sweep", stdout=out)
    assert "default: published 1" in out.getvalue()
    assert published(world) == ["f"]


def test_status_shows_the_others_then_fails_naming_it(app: Celery) -> None:
    left_behind(app, "g")
    out = io.StringIO()
    with pytest.raises(CommandError, match=rf"outbox status: database {GONE}: .*{NAMES_IT}"):
        call_command("outbox", "status", stdout=out)
    assert "database default:" in out.getvalue()
    assert OutboxMessage.objects.get(task_id="g").status == "pending"


def test_health_is_a_reason_naming_it(app: Celery) -> None:
    reasons = check(app)
    assert any(r.startswith(f"database {GONE}: ") and "not in DATABASES" in r for r in reasons)
    err = io.StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("outbox", "health", stderr=err, stdout=io.StringIO())
    assert exited.value.code == 1
    assert f"database {GONE}: cannot read the outbox" in err.getvalue()
