"""``celery_outbox.health.check`` over the in-memory store (its clock moved by hand)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest
from celery import Celery

from celery_outbox import OutboxTask, StoreError
from celery_outbox.config import OutboxConfig
from celery_outbox.dispatch.envelope import build_message
from celery_outbox.health import HealthLimits, check
from celery_outbox.registry import install_store
from celery_outbox.store.base import Backlog
from celery_outbox.store.records import MessageStatus
from celery_outbox.testing import InMemoryOutboxStore

START = datetime(2030, 1, 1, tzinfo=timezone.utc)
MINUTE = timedelta(minutes=1)


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> datetime:
        return self.now


class DownStore(InMemoryOutboxStore):
    def backlog(self, *, using: str | None = None, bound: int | None = None) -> Backlog:
        raise StoreError("celery-outbox could not read the outbox backlog: connection refused")


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("health", broker="memory://", set_as_current=False)
    app.conf.update(outbox_sweep_interval=5.0, outbox_publish_grace=10.0)

    @app.task(base=OutboxTask, name="unit.noop", shared=False)
    def noop() -> None:
        return None

    yield app
    app.close()


@pytest.fixture
def store(app: Celery, clock: Clock) -> InMemoryOutboxStore:
    store = InMemoryOutboxStore(clock=clock)
    install_store(app, store)
    store.record_sweep(every=timedelta(0))
    return store


def add_row(app: Celery, store: InMemoryOutboxStore, *, due: datetime) -> int:
    message = build_message(
        app.tasks["unit.noop"],
        (),
        {},
        task_id=f"task-{len(store.rows)}",
        options={},
        now=due,
        park_after=timedelta(seconds=30),
        max_bytes=None,
    )
    row_id = store.add(message)
    assert row_id is not None
    return row_id


def test_a_fresh_outbox_with_a_recent_sweep_is_healthy(
    app: Celery, store: InMemoryOutboxStore
) -> None:
    add_row(app, store, due=START)
    assert check(app) == []


def test_a_due_row_waiting_past_the_limit_is_a_reason(
    app: Celery, store: InMemoryOutboxStore, clock: Clock
) -> None:
    add_row(app, store, due=START)
    clock.now += 2 * MINUTE
    store.record_sweep(every=timedelta(0))

    assert check(app, max_pending_age=MINUTE) == [
        "the oldest due outbox row has waited 120.0 s, longer than max pending age 60.0 s: "
        "is the sweep (beat or the relay) running, and the broker reachable?"
    ]
    assert check(app, max_pending_age=3 * MINUTE) == []


def test_the_default_pending_limit_is_the_grace_and_three_sweep_intervals(
    app: Celery, store: InMemoryOutboxStore, clock: Clock
) -> None:
    add_row(app, store, due=START)
    clock.now += timedelta(seconds=25)
    store.record_sweep(every=timedelta(0))
    assert check(app) == []

    clock.now += timedelta(seconds=1)
    store.record_sweep(every=timedelta(0))
    assert [r.split(",")[0] for r in check(app)] == ["the oldest due outbox row has waited 26.0 s"]


def test_rows_due_later_are_never_late(
    app: Celery, store: InMemoryOutboxStore, clock: Clock
) -> None:
    add_row(app, store, due=START + timedelta(days=1))
    assert check(app, max_pending_age=timedelta(seconds=1)) == []


def test_an_old_sweep_is_a_reason_and_three_intervals_the_default(
    app: Celery, store: InMemoryOutboxStore, clock: Clock
) -> None:
    clock.now += timedelta(seconds=15)
    assert check(app) == []

    clock.now += timedelta(seconds=1)
    assert check(app) == [
        "the last sweep ran 16.0 s ago, longer than max sweep age 15.0 s: is celery beat "
        "(or `outbox relay`) running, and a worker consuming the sweep task?"
    ]
    assert check(app, max_sweep_age=MINUTE) == []


def test_no_sweep_ever_is_a_reason(app: Celery, clock: Clock) -> None:
    install_store(app, InMemoryOutboxStore(clock=clock))
    assert check(app) == ["no sweep has run yet: is celery beat (or `outbox relay`) running?"]


def test_failed_rows_are_a_reason_only_when_asked(app: Celery, store: InMemoryOutboxStore) -> None:
    row_id = add_row(app, store, due=START)
    store.rows[row_id] = replace(store.rows[row_id], status=MessageStatus.FAILED)

    assert check(app) == []
    assert check(app, fail_on_failed=True) == [
        "1 failed outbox row(s): publishing gave up (read last_error, fix, then reset them)"
    ]


def test_every_reason_is_listed(app: Celery, store: InMemoryOutboxStore, clock: Clock) -> None:
    failed = add_row(app, store, due=START)
    store.rows[failed] = replace(store.rows[failed], status=MessageStatus.FAILED)
    add_row(app, store, due=START)
    clock.now += MINUTE

    reasons = check(app, fail_on_failed=True)

    assert [r.split(" ")[1] for r in reasons] == ["oldest", "last", "failed"]


def test_a_store_that_cannot_be_read_is_a_reason_not_an_exception(
    app: Celery, clock: Clock
) -> None:
    install_store(app, DownStore(clock=clock))
    assert check(app) == [
        "cannot read the outbox: celery-outbox could not read the outbox backlog: "
        "connection refused"
    ]


def test_reasons_name_their_database_when_the_store_has_aliases(
    app: Celery, store: InMemoryOutboxStore
) -> None:
    add_row(app, store, due=START - MINUTE)
    assert check(app, max_pending_age=timedelta(seconds=1), aliases=["orders"]) == [
        "database orders: the oldest due outbox row has waited 60.0 s, longer than max "
        "pending age 1.0 s: is the sweep (beat or the relay) running, and the broker reachable?"
    ]


@pytest.mark.parametrize("bad", [timedelta(0), timedelta(seconds=-1), 30])
def test_a_limit_that_is_not_a_positive_timedelta_is_refused(app: Celery, bad: object) -> None:
    with pytest.raises(ValueError, match=r"max_sweep_age=.* is not accepted: give a positive"):
        check(app, max_sweep_age=bad)  # type: ignore[arg-type]


def test_default_limits_follow_the_settings(app: Celery) -> None:
    app.conf.update(outbox_sweep_interval=2.0, outbox_publish_grace=1.0)
    assert HealthLimits.defaults(OutboxConfig.from_celery(app)) == HealthLimits(
        max_pending_age=timedelta(seconds=7), max_sweep_age=timedelta(seconds=6)
    )
