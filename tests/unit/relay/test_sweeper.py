"""Sweeper over the in-memory store and kombu's in-memory broker: batches, outcomes, loop."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery

from celery_outbox import OutboxTask, StoreError
from celery_outbox.config import OutboxConfig
from celery_outbox.dispatch.envelope import build_message
from celery_outbox.registry import install_store
from celery_outbox.relay.relay import relay_for
from celery_outbox.relay.sweeper import Sweeper, SweepReport
from celery_outbox.store.records import Claim, MessageStatus, NewMessage
from celery_outbox.testing import InMemoryOutboxStore
from tests.messages import numbered
from tests.services import free_port
from tests.unit.worker.support import queued_ids

START = datetime(2030, 1, 1, tzinfo=timezone.utc)
GRACE = timedelta(seconds=10)


class FakeClock:
    """A clock tests move by hand (``step`` is added after every reading)."""

    def __init__(self, *, step: timedelta = timedelta(0)) -> None:
        self.now, self.step = START, step

    def __call__(self) -> datetime:
        now = self.now
        self.now += self.step
        return now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def app(queue_name: str) -> Iterator[Celery]:
    app = Celery("sweeper-unit", broker="memory://", set_as_current=False)
    app.conf.update(
        task_default_queue=queue_name,
        outbox_publish_grace=GRACE.total_seconds(),
        outbox_sweep_batch_size=3,
        outbox_publish_max_attempts=3,
    )

    @app.task(base=OutboxTask, name="unit.noop", shared=False)
    def noop(n: int) -> int:
        return n

    yield app
    app.close()


@pytest.fixture
def store(app: Celery, clock: FakeClock) -> InMemoryOutboxStore:
    store = InMemoryOutboxStore(clock=clock)
    install_store(app, store)
    return store


@pytest.fixture
def closed_port() -> int:
    """A loopback port nobody listens on: a broker that is down."""
    return free_port()


def make_sweeper(
    app: Celery,
    store: InMemoryOutboxStore,
    clock: FakeClock,
    budget: timedelta = timedelta(seconds=30),
) -> Sweeper:
    relay = relay_for(app)
    relay.clock = clock
    return Sweeper(
        app=app,
        store=store,
        relay=relay,
        config=OutboxConfig.from_celery(app),
        clock=clock,
        budget=budget,
    )


def committed_rows(
    app: Celery, store: InMemoryOutboxStore, count: int, task_name: str = "unit.noop"
) -> list[int]:
    """Rows written as a crash after COMMIT leaves them: in the table, never published."""
    ids = []
    for n in range(count):
        message = numbered(app.tasks["unit.noop"], n, now=START)
        if task_name != message.task_name:
            message = NewMessage(
                task_id=message.task_id,
                task_name=task_name,
                payload=message.payload,
                options=message.options,
                available_at=message.available_at,
            )
        row_id = store.add(message)
        assert row_id is not None
        ids.append(row_id)
    return ids


def test_one_sweep_publishes_every_due_row_in_batches(
    app: Celery, store: InMemoryOutboxStore, clock: FakeClock, queue_name: str
) -> None:
    committed_rows(app, store, 7)
    clock.now = START + GRACE

    report = make_sweeper(app, store, clock).sweep()

    assert report == SweepReport(published=7, batches=3)
    assert store.rows == {}
    assert sorted(queued_ids(queue_name)) == sorted(f"task-{n}" for n in range(7))


def test_rows_younger_than_the_grace_are_left_to_their_publisher(
    app: Celery, store: InMemoryOutboxStore, clock: FakeClock, queue_name: str
) -> None:
    committed_rows(app, store, 2)
    clock.now = START + GRACE - timedelta(seconds=1)

    assert make_sweeper(app, store, clock).sweep() == SweepReport()
    assert len(store.rows) == 2
    assert queued_ids(queue_name) == []


def test_published_rows_are_kept_when_retention_is_on(
    app: Celery, store: InMemoryOutboxStore, clock: FakeClock
) -> None:
    app.conf.outbox_keep_published = 60.0  # read once, when the app is finalised
    committed_rows(app, store, 2)
    clock.now = START + GRACE

    make_sweeper(app, store, clock).sweep()

    assert {r.status for r in store.rows.values()} == {MessageStatus.PUBLISHED}


def test_kept_rows_are_purged_once_they_outlive_the_retention(
    app: Celery, store: InMemoryOutboxStore, clock: FakeClock
) -> None:
    app.conf.outbox_keep_published = 60.0
    committed_rows(app, store, 4)
    clock.now = START + GRACE
    sweeper = make_sweeper(app, store, clock)

    assert sweeper.sweep_all().purged == 0  # just published: kept
    assert len(store.rows) == 4
    clock.now = START + timedelta(seconds=61)
    report = sweeper.sweep_all()

    assert report.purged == 3  # one bounded batch (outbox_sweep_batch_size) per sweep
    assert sweeper.sweep_all().purged == 1
    assert store.rows == {}


def test_an_unregistered_task_fails_at_once_and_the_sweep_goes_on(
    app: Celery, store: InMemoryOutboxStore, clock: FakeClock, queue_name: str
) -> None:
    [bad] = committed_rows(app, store, 1, task_name="unit.gone")
    good = numbered(app.tasks["unit.noop"], 1, task_id="good", now=START)
    store.add(good)
    clock.now = START + GRACE

    report = make_sweeper(app, store, clock).sweep()

    assert report == SweepReport(published=1, failed=1, batches=1)
    assert store.rows[bad].status is MessageStatus.FAILED
    assert "unit.gone" in store.rows[bad].last_error
    assert queued_ids(queue_name) == ["good"]


def test_broker_down_reschedules_and_stops_after_one_batch(
    app: Celery, store: InMemoryOutboxStore, clock: FakeClock, closed_port: int
) -> None:
    app.conf.broker_url = f"amqp://guest:guest@127.0.0.1:{closed_port}//"
    committed_rows(app, store, 5)
    clock.now = START + GRACE

    report = make_sweeper(app, store, clock).sweep()

    assert report == SweepReport(rescheduled=3, batches=1)
    claimed = [r for r in store.rows.values() if r.attempts]
    assert len(claimed) == 3
    for row in claimed:
        assert row.status is MessageStatus.PENDING
        assert row.locked_until is None
        assert clock.now + timedelta(seconds=1) <= row.available_at  # retry 1: 1-2 s
        assert row.available_at <= clock.now + timedelta(seconds=2, milliseconds=10)
        assert "Error" in row.last_error


def test_a_row_at_its_last_attempt_becomes_failed(
    app: Celery, store: InMemoryOutboxStore, clock: FakeClock, closed_port: int
) -> None:
    app.conf.broker_url = f"amqp://guest:guest@127.0.0.1:{closed_port}//"
    committed_rows(app, store, 1)
    sweeper = make_sweeper(app, store, clock)
    outcomes = []
    for _ in range(3):
        clock.now += timedelta(minutes=10)
        outcomes.append(sweeper.sweep())

    assert outcomes == [SweepReport(rescheduled=1, batches=1)] * 2 + [
        SweepReport(failed=1, batches=1)
    ]
    [row] = store.rows.values()
    assert (row.status, row.attempts) == (MessageStatus.FAILED, 3)


def test_the_time_budget_ends_a_sweep_with_rows_left(
    app: Celery, store: InMemoryOutboxStore, queue_name: str
) -> None:
    ticking = FakeClock(step=timedelta(seconds=1))
    store.clock = ticking
    committed_rows(app, store, 10)
    ticking.now = START + GRACE + timedelta(seconds=20)

    report = make_sweeper(app, store, ticking, budget=timedelta(seconds=3)).sweep()

    assert report.more
    assert report.published < 10
    assert len(queued_ids(queue_name)) == report.published


class TwoAliasStore(InMemoryOutboxStore):
    """Records the aliases a sweep passes; fails its first ``fail`` claims."""

    def __init__(self, *, clock: FakeClock, fail: int = 0) -> None:
        super().__init__(clock=clock)
        self.aliases: list[str | None] = []
        self.fail = fail

    def sweep_aliases(self) -> Sequence[str | None]:
        return ["primary", "replica"]

    def claim_due(
        self,
        *,
        now: datetime,
        created_before: datetime,
        limit: int,
        lease_until: datetime,
        max_bytes: int | None = None,
        using: str | None = None,
    ) -> Claim:
        self.aliases.append(using)
        if self.fail:
            self.fail -= 1
            raise StoreError("database is down")
        return super().claim_due(
            now=now,
            created_before=created_before,
            limit=limit,
            lease_until=lease_until,
            max_bytes=max_bytes,
            using=using,
        )


def test_sweep_all_covers_every_alias_of_the_store(app: Celery, clock: FakeClock) -> None:
    store = TwoAliasStore(clock=clock)
    install_store(app, store)

    assert make_sweeper(app, store, clock).sweep_all() == SweepReport()
    assert store.aliases == ["primary", "replica"]


def test_a_failing_alias_does_not_stop_the_others_and_is_named(
    app: Celery, clock: FakeClock, queue_name: str
) -> None:
    store = TwoAliasStore(clock=clock, fail=1)  # the first alias, "primary", fails
    install_store(app, store)
    committed_rows(app, store, 3)
    clock.now = START + GRACE

    with pytest.raises(StoreError, match=r"database\(s\) 'primary' .*'primary': database is down"):
        make_sweeper(app, store, clock).sweep_all()

    assert store.aliases[0] == "primary"
    assert "replica" in store.aliases
    assert len(queued_ids(queue_name)) == 3  # the in-memory store's rows, swept as "replica"


def test_a_single_alias_error_is_raised_as_is(app: Celery, clock: FakeClock) -> None:
    store = TwoAliasStore(clock=clock, fail=1)
    install_store(app, store)
    with pytest.raises(StoreError, match=r"^database is down$"):
        make_sweeper(app, store, clock).sweep_all(["primary"])


def test_run_survives_store_errors_and_stops_on_the_event(
    app: Celery, clock: FakeClock, queue_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = TwoAliasStore(clock=clock, fail=2)
    install_store(app, store)
    committed_rows(app, store, 4)
    clock.now = START + GRACE
    stop = threading.Event()
    sweeper = make_sweeper(app, store, clock)
    thread = threading.Thread(target=sweeper.run, args=(stop, 0.01))
    thread.start()
    try:
        deadline = threading.Event()
        for _ in range(500):
            if not store.rows:
                break
            deadline.wait(0.01)
    finally:
        stop.set()
        thread.join(timeout=5)

    assert not thread.is_alive()
    assert store.rows == {}
    assert len(queued_ids(queue_name)) == 4
    # Both aliases failed in the first pass (one error each, naming it), then a good pass.
    assert caplog.text.count("could not sweep database") == 2
    assert "could not sweep database 'replica'" in caplog.text


# -- the byte budget (outbox_sweep_batch_bytes) -------------------------------------------
def large_rows(app: Celery, store: InMemoryOutboxStore, count: int, size: int) -> list[int]:
    """Rows whose payload is about ``size`` bytes each."""
    ids = []
    for n in range(count):
        message = build_message(
            app.tasks["unit.noop"],
            ("x" * size,),
            {},
            task_id=f"large-{n}",
            options={},
            now=START,
            park_after=timedelta(seconds=30),
            max_bytes=None,
        )
        row_id = store.add(message)
        assert row_id is not None
        ids.append(row_id)
    return ids


def test_a_batch_cut_by_the_byte_budget_does_not_end_the_sweep(
    app: Celery, store: InMemoryOutboxStore, clock: FakeClock, queue_name: str
) -> None:
    app.conf.outbox_sweep_batch_bytes = 64 * 1024  # 2 rows of 40 KB, below the 3-row limit
    large_rows(app, store, 5, 40_000)
    clock.now = START + GRACE

    report = make_sweeper(app, store, clock).sweep()

    assert report == SweepReport(published=5, batches=3)
    assert len(queued_ids(queue_name)) == 5


class ClaimRecordingStore(InMemoryOutboxStore):
    """Records the payload bytes of every claim of ids."""

    claimed: list[int]

    def claim(self, ids: Iterable[int], **kwargs: Any) -> Claim:
        found = super().claim(ids, **kwargs)
        self.claimed.append(sum(len(m.payload) for m in found.messages))
        return found


def test_publish_now_claims_a_long_list_of_large_rows_by_the_byte_budget(
    app: Celery, clock: FakeClock, queue_name: str
) -> None:
    app.conf.outbox_sweep_batch_bytes = 64 * 1024
    store = ClaimRecordingStore(clock=clock)
    store.claimed = []
    install_store(app, store)
    ids = large_rows(app, store, 5, 40_000)

    relay = relay_for(app)
    relay.clock = clock

    report = relay.publish_ids(ids)

    assert sorted(report.published) == ids
    assert len(queued_ids(queue_name)) == 5
    assert len(store.claimed) == 3  # 2 + 2 + 1 rows
    assert max(store.claimed) < 2 * 40_500
