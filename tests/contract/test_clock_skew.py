"""Hosts whose clocks are a minute off agree on the database's clock (DESIGN.md,
"Publishing and sweeping").

Each role runs with this host's wall clock (``celery_outbox.clock.utcnow``, wherever
it is called from, and Celery's ``app.now()``) shifted by ±60 s, against one store: a
producer dispatching rows born leased, a sweeper racing its on-commit publisher, a
worker parking a retry, a producer parking a countdown. The database's clock is the
server's on PostgreSQL and MySQL/MariaDB; the in-memory store's and SQLite's (which have
none but their host's) is pinned to the real time here, so no role shifts it. Nothing is
published twice, nothing is due early by the database's clock, nothing is lost.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any, cast

import pytest
from celery import Celery
from celery.exceptions import Retry

from celery_outbox import OutboxTask, clock
from celery_outbox.config import OutboxConfig
from celery_outbox.registry import install_store, store_for
from celery_outbox.relay.relay import PublishPath, PublishReport, Relay
from celery_outbox.relay.sweeper import Sweeper
from celery_outbox.signals import message_published
from celery_outbox.state import state_of
from celery_outbox.store.records import Claim, MessageStatus
from celery_outbox.worker.attempt import Attempt
from celery_outbox.worker.republish import schedule_retry
from tests.contract.harness import Harness

TASK = "tests.contract.clock_skew.noop"
MINUTE = 60.0
#: (producer, sweeper) shifts of the host clock, in seconds.
RACES = [(-MINUTE, MINUTE), (0.0, MINUTE), (-MINUTE, 0.0), (MINUTE, -MINUTE)]
_REAL_DATETIME = datetime


def noop(*args: Any) -> None:
    """A task body that does nothing."""


@contextmanager
def host_clock(seconds: float, app: Celery | None = None) -> Iterator[None]:
    """This host's wall clock ``seconds`` off: every ``utcnow`` of both packages, even
    one bound as a default argument, and ``app.now()`` (Celery's, which turns a
    countdown into an ETA) read it, as under libfaketime.
    """
    shift = timedelta(seconds=seconds)

    class HostDatetime(datetime):
        @classmethod
        def now(cls, tz: tzinfo | None = None) -> datetime:  # type: ignore[override]
            return _REAL_DATETIME.now(tz) + shift

    clock.datetime = HostDatetime  # type: ignore[attr-defined]
    if app is not None:
        app.now = lambda: HostDatetime.now(timezone.utc)  # type: ignore[method-assign]
    try:
        yield
    finally:
        clock.datetime = _REAL_DATETIME  # type: ignore[attr-defined]
        if app is not None:
            del app.now


def _database_clock() -> datetime:
    return _REAL_DATETIME.now(timezone.utc)


class RacingRelay(Relay):
    """A relay whose on-commit publisher lets ``race`` run once it holds its rows and
    before it sends them: the moment a sweeper taking those rows would publish them twice.
    """

    race: Callable[[], object] | None = None

    def publish_claim(
        self,
        claim: Claim,
        *,
        using: str | None = None,
        validate: bool = False,
        path: PublishPath = "sweep",
    ) -> PublishReport:
        race, self.race = self.race, None
        if path == "commit" and race is not None:
            race()
        return super().publish_claim(claim, using=using, validate=validate, path=path)


@pytest.fixture
def app(harness: Harness) -> Iterator[Celery]:
    app = Celery("clock_skew", broker="memory://", set_as_current=False)
    install_store(app, harness.store)
    app.task(base=OutboxTask, name=TASK, shared=False)(noop)
    store = cast(Any, harness.store)
    if hasattr(store, "clock"):  # SQLite and the in-memory store: the host's clock is the
        store.clock = _database_clock  # database's; here the database's, which no role shifts
    relay = RacingRelay(app, store=harness.store, config=OutboxConfig.from_celery(app))
    state_of(app).relay = relay
    yield app
    relay.close()
    app.close()


@pytest.fixture
def published(app: Celery) -> Iterator[Counter[str]]:
    """How many times each task id reached the broker."""
    counts: Counter[str] = Counter()

    def count(sender: Any, task_ids: Sequence[str], **_: Any) -> None:
        if sender is app:
            counts.update(task_ids)

    message_published.connect(count, weak=False)
    yield counts
    message_published.disconnect(count)


def sweep(app: Celery, shift: float) -> int:
    """One sweep from a host whose clock is ``shift`` seconds off; rows it published."""
    relay = state_of(app).relay
    assert isinstance(relay, Relay)
    with host_clock(shift):
        sweeper = Sweeper(
            app=app, store=store_for(app), relay=relay, config=OutboxConfig.from_celery(app)
        )
        return sweeper.sweep_all().published


def pending(harness: Harness) -> int:
    return harness.store.count_by_status()[MessageStatus.PENDING]


@pytest.mark.parametrize(("producer", "sweeper"), RACES)
def test_a_sweeper_off_by_a_minute_never_takes_a_live_producers_rows(
    harness: Harness, app: Celery, published: Counter[str], producer: float, sweeper: float
) -> None:
    relay = state_of(app).relay
    assert isinstance(relay, RacingRelay)
    swept: list[int] = []
    relay.race = lambda: swept.append(sweep(app, sweeper))
    with host_clock(producer, app), harness.transaction():
        ids = [app.tasks[TASK].delay(n).id for n in range(5)]

    assert swept == [0]  # the sweeper ran in the race and took none of the born leases
    assert published == Counter(dict.fromkeys(ids, 1))  # each once: no double publish
    harness.settle()
    assert pending(harness) == 0  # none lost, none left behind


@pytest.mark.parametrize("worker", [-MINUTE, MINUTE])
@pytest.mark.parametrize("sweeper", [-MINUTE, 0.0, MINUTE])
def test_a_retry_parked_by_a_worker_off_by_a_minute_is_not_due_early(
    harness: Harness, app: Celery, published: Counter[str], worker: float, sweeper: float
) -> None:
    task_id, delay = f"retry-{uuid.uuid4()}", timedelta(seconds=30)
    attempt = Attempt(task_name=TASK, task_id=task_id, args=(1,), options={"queue": "celery"})
    before = harness.store.now()
    with host_clock(worker):
        retry = schedule_retry(
            app.tasks[TASK],
            attempt,
            ValueError("boom"),
            delay=delay,
            park=True,
            now=clock.utcnow(),
        )
    assert isinstance(retry, Retry)

    assert sweep(app, sweeper) == 0  # not due: by the database's clock it waits 30 s
    assert published == Counter()
    later = before + delay + timedelta(seconds=5)
    (row,) = harness.store.claim_due(
        now=later, created_before=later, limit=10, lease_until=later + timedelta(minutes=1)
    ).messages
    assert (row.task_id, pending(harness)) == (task_id, 1)  # kept, due 30 s after parking
    assert row.available_at >= before + delay


@pytest.mark.parametrize("producer", [-MINUTE, MINUTE])
@pytest.mark.parametrize("sweeper", [0.0, MINUTE])
def test_a_countdown_parked_by_a_producer_off_by_a_minute_is_not_due_early(
    harness: Harness, app: Celery, published: Counter[str], producer: float, sweeper: float
) -> None:
    countdown = 90  # parked: longer than outbox_park_after
    before = harness.store.now()
    with host_clock(producer, app):
        task_id = app.tasks[TASK].apply_async((1,), countdown=countdown).id

    assert sweep(app, sweeper) == 0
    assert published == Counter()
    (row,) = harness.store.claim_due(
        now=before + timedelta(seconds=countdown + 5),
        created_before=before + timedelta(seconds=countdown + 5),
        limit=10,
        lease_until=before + timedelta(hours=1),
    ).messages
    assert row.task_id == task_id
    assert row.available_at >= before + timedelta(seconds=countdown)
