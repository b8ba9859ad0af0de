"""The sweeper records that it ran: once per interval at most, whatever it costs."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
from celery import Celery

from celery_outbox import OutboxTask, StoreError
from celery_outbox.config import OutboxConfig
from celery_outbox.dispatch.envelope import build_message
from celery_outbox.registry import install_store
from celery_outbox.relay.relay import relay_for
from celery_outbox.relay.sweeper import Sweeper
from celery_outbox.testing import InMemoryOutboxStore

START = datetime(2030, 1, 1, tzinfo=timezone.utc)
INTERVAL = timedelta(seconds=5)


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> datetime:
        return self.now


class CountingStore(InMemoryOutboxStore):
    """Counts the sweep record's calls and its writes."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock=clock)
        self.asked = self.wrote = 0

    def record_sweep(self, *, every: timedelta, using: str | None = None) -> bool:
        self.asked += 1
        wrote = super().record_sweep(every=every, using=using)
        self.wrote += wrote
        return wrote


class BrokenRecordStore(InMemoryOutboxStore):
    def record_sweep(self, *, every: timedelta, using: str | None = None) -> bool:
        raise StoreError("relation celery_outbox_sweep does not exist")


@pytest.fixture
def app(queue_name: str) -> Iterator[Celery]:
    app = Celery("sweep-record", broker="memory://", set_as_current=False)
    app.conf.update(task_default_queue=queue_name, outbox_sweep_interval=INTERVAL.total_seconds())

    @app.task(base=OutboxTask, name="unit.noop", shared=False)
    def noop() -> None:
        return None

    yield app
    app.close()


def sweeper(app: Celery, store: InMemoryOutboxStore, clock: Clock) -> Sweeper:
    install_store(app, store)
    config = OutboxConfig.from_celery(app)
    return Sweeper(app=app, store=store, relay=relay_for(app), config=config, clock=clock)


def test_a_sweep_loop_writes_the_record_once_per_interval_at_most(app: Celery) -> None:
    clock = Clock()
    store = CountingStore(clock)
    relay_loop = sweeper(app, store, clock)

    for _ in range(200):  # 20 s of a relay loop sweeping every 0.1 s
        relay_loop.sweep()
        clock.now += timedelta(milliseconds=100)

    assert store.wrote == 4  # at 0, 5, 10 and 15 s
    assert store.asked <= 2 * 4  # asked at most every half interval
    last = store.last_sweep()
    assert last is not None
    assert last.at == START + timedelta(seconds=15)


def test_several_sweepers_write_once_per_interval_between_them(app: Celery) -> None:
    clock = Clock()
    store = CountingStore(clock)
    sweepers = [sweeper(app, store, clock) for _ in range(3)]

    for _ in range(100):  # 10 s, each of the three sweeping every 0.1 s
        for each in sweepers:
            each.sweep()
        clock.now += timedelta(milliseconds=100)

    assert store.wrote == 2  # at 0 and 5 s


def test_a_beat_sweep_records_itself_again_after_an_interval(app: Celery) -> None:
    # Beat builds a new sweeper per run: nothing is remembered in the process.
    clock = Clock()
    store = CountingStore(clock)
    for _ in range(4):
        sweeper(app, store, clock).sweep()
        clock.now += INTERVAL

    assert (store.asked, store.wrote) == (4, 4)


def test_a_sweep_whose_record_fails_still_publishes_and_says_so(
    app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    store = BrokenRecordStore(clock=clock)
    message = build_message(
        app.tasks["unit.noop"],
        (),
        {},
        task_id="left-behind",
        options={},
        now=START - timedelta(minutes=1),
        park_after=timedelta(seconds=30),
        max_bytes=None,
    )
    store.add(message)
    clock.now += timedelta(minutes=1)

    with caplog.at_level(logging.WARNING, logger="celery_outbox.relay.sweeper"):
        report = sweeper(app, store, clock).sweep()

    assert report.published == 1
    assert "could not record the sweep of the default database" in caplog.text
