"""A sweep of a backlog claims its next batch on a thread while a batch publishes.

PostgreSQL and a real broker. The claim made ahead runs on a thread of its own with its
own connection, closed when the sweep ends; a sweep that stops (broker unreachable)
gives that claim's rows back, unleased and unattempted; inside an atomic block (whose
rows another connection cannot see) every claim stays on the caller's thread.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from django.db import connection, transaction

from celery_outbox.config import OutboxConfig
from celery_outbox.relay.relay import Relay
from celery_outbox.relay.sweeper import Sweeper
from django_outbox.models import OutboxMessage
from django_outbox.store import DjangoOutboxStore
from django_outbox.store import transactions as published
from tests.brokers import take_task_ids
from tests.django.celery_app import create_app
from tests.django.conftest import World
from tests.django.helpers import postgres_only
from tests.messages import numbered

pytestmark = [pytest.mark.django_db(transaction=True), postgres_only]

#: Rows a batch holds here, and the backlog: three full batches and a short one.
BATCH, ROWS = 20, 70


def backlog(world: World, store: DjangoOutboxStore) -> list[str]:
    """Write :data:`ROWS` due, unleased rows of ``world.record``; their task ids."""
    due = datetime.now(timezone.utc) - timedelta(minutes=1)
    ids = []
    for n in range(ROWS):
        message = numbered(world.record, n, task_id=f"ahead-{n}", now=due)
        store.add(replace(message, locked_until=None))
        ids.append(message.task_id)
    return ids


def sweeper_of(app: Any, store: DjangoOutboxStore) -> Sweeper:
    """A sweeper of ``app`` publishing rows of any age, :data:`BATCH` rows a claim."""
    config = replace(OutboxConfig.from_celery(app), publish_grace=timedelta(0))
    config = replace(config, sweep_batch_size=BATCH)
    return Sweeper(
        app=app, store=store, relay=Relay(app, store=store, config=config), config=config
    )


@pytest.fixture
def claimers(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of the thread of each claim the sweeps make."""
    names: list[str] = []
    claim_due = DjangoOutboxStore.claim_due

    def recording(self: DjangoOutboxStore, **kwargs: Any) -> Any:
        names.append(threading.current_thread().name)
        return claim_due(self, **kwargs)

    monkeypatch.setattr(DjangoOutboxStore, "claim_due", recording)
    return names


def backends() -> int:
    """Connections to the test database, this one included."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


def test_a_backlog_is_claimed_ahead_on_a_thread_whose_connection_ends_with_the_sweep(
    world: World, claimers: list[str]
) -> None:
    store = DjangoOutboxStore()
    ids = backlog(world, store)
    sweeper = sweeper_of(world.app, store)
    published.settle()
    before = backends()

    report = sweeper.sweep()

    assert report.published == ROWS
    assert report.batches == 4
    main = threading.current_thread().name
    assert claimers[0] == main  # the first claim: nothing says a backlog waits yet
    assert all(name.startswith("celery-outbox-claim") for name in claimers[1:]), claimers
    assert not any(t.name.startswith("celery-outbox-claim") for t in threading.enumerate())
    published.settle()  # the deletes' thread's connection too
    assert backends() == before, "the claiming thread's connection outlived the sweep"
    assert sorted(take_task_ids(world.app.conf.broker_url, world.queue)) == sorted(ids)
    assert not OutboxMessage.objects.exists()


def test_a_sweep_stopped_by_an_unreachable_broker_gives_back_the_claim_made_ahead(
    world: World, claimers: list[str]
) -> None:
    store = DjangoOutboxStore()
    backlog(world, store)
    down = create_app("redis://127.0.0.1:1/0", world.queue, outbox_publish_timeout=1.0)
    sweeper = sweeper_of(down, store)

    report = sweeper.sweep()

    assert report.published == 0
    assert report.rescheduled == BATCH
    assert report.batches == 1
    assert len(claimers) == 2
    assert claimers[1].startswith("celery-outbox-claim")
    tried = OutboxMessage.objects.filter(attempts=1)
    assert tried.count() == BATCH
    given_back = OutboxMessage.objects.filter(attempts=0)
    assert given_back.count() == ROWS - BATCH
    # The claim made ahead is pending again and unleased: the next sweep may take it now.
    assert not given_back.filter(locked_until__isnull=False).exists()
    assert not given_back.exclude(status="pending").exists()
    assert given_back.filter(available_at__lte=datetime.now(timezone.utc)).count() == ROWS - BATCH
    down.close()


def test_inside_an_atomic_block_every_claim_stays_on_the_callers_thread(
    world: World, claimers: list[str]
) -> None:
    store = DjangoOutboxStore()
    ids = backlog(world, store)
    sweeper = sweeper_of(world.app, store)

    with transaction.atomic():
        report = sweeper.sweep()

    assert report.published == ROWS
    assert set(claimers) == {threading.current_thread().name}
    assert sorted(take_task_ids(world.app.conf.broker_url, world.queue)) == sorted(ids)
