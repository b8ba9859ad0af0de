"""The relay loop's passes (``celery_outbox.relay.loop``) over the in-memory store and
kombu's in-memory broker: maintenance once per sweep interval, the pause until the next
parked row, the back-off after store errors. Waking on NOTIFY: ``test_listener.py`` and
``tests/integration/test_relay_notify.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery

from celery_outbox import OutboxTask, StoreError
from celery_outbox.config import OutboxConfig
from celery_outbox.dispatch.envelope import build_message
from celery_outbox.registry import install_store
from celery_outbox.relay.loop import MAX_ERROR_BACKOFF, RelayLoop
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
    """The in-memory store, counting maintenance calls; ``fail`` claims raise."""

    def __init__(self, clock: Clock, fail: int = 0) -> None:
        super().__init__(clock=clock)
        self.purges, self.fail = 0, fail

    def purge_completed(self, **kwargs: Any) -> int:
        self.purges += 1
        return super().purge_completed(**kwargs)

    def claim_due(self, **kwargs: Any) -> Any:
        if self.fail:
            self.fail -= 1
            raise StoreError("database down")
        return super().claim_due(**kwargs)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def app(queue_name: str) -> Iterator[Celery]:
    app = Celery("relay-loop-unit", broker="memory://", set_as_current=False)
    app.conf.update(
        task_default_queue=queue_name,
        outbox_publish_grace=0,
        outbox_sweep_interval=INTERVAL.total_seconds(),
    )
    app.task(base=OutboxTask, name="unit.loop.noop", shared=False)(noop)
    yield app
    relay_for(app).close()
    app.close()


def noop(n: int) -> int:
    return n


def loop_of(app: Celery, store: CountingStore, clock: Clock) -> RelayLoop:
    install_store(app, store)
    relay = relay_for(app)
    relay.clock = clock
    config = OutboxConfig.from_celery(app)
    return RelayLoop(Sweeper(app=app, store=store, relay=relay, config=config, clock=clock))


def park(app: Celery, store: CountingStore, available_at: datetime) -> None:
    message = build_message(
        app.tasks["unit.loop.noop"],
        (1,),
        {},
        task_id=f"parked-{available_at.isoformat()}",
        options={"eta": available_at},
        now=START,
        park_after=timedelta(0),
        max_bytes=None,
    )
    assert message.available_at == available_at
    assert store.add(message) is not None


def test_maintenance_runs_at_most_once_per_sweep_interval(app: Celery, clock: Clock) -> None:
    store = CountingStore(clock)
    loop = loop_of(app, store, clock)
    for _ in range(3):
        assert loop._pass(0.2, 0, [None]) == (0.2, 0)
    assert store.purges == 1
    clock.now += INTERVAL
    loop._pass(0.2, 0, [None])
    assert store.purges == 2


def test_the_pause_ends_when_the_next_parked_row_comes_due(app: Celery, clock: Clock) -> None:
    store = CountingStore(clock)
    loop = loop_of(app, store, clock)
    assert loop._until_due(0.2, [None]) == 0.2
    park(app, store, START + timedelta(seconds=10))
    assert loop._until_due(0.2, [None]) == 0.2
    park(app, store, START + timedelta(milliseconds=50))
    assert loop._until_due(0.2, [None]) == pytest.approx(0.05)


def test_store_errors_double_the_pause_up_to_the_bound(
    app: Celery, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    store = CountingStore(clock, fail=20)
    loop = loop_of(app, store, clock)
    assert loop._pass(0.2, 0, [None]) == (0.2, 1)
    assert loop._pass(0.2, 3, [None]) == (1.6, 4)
    assert loop._pass(0.2, 19, [None]) == (MAX_ERROR_BACKOFF.total_seconds(), 20)
    assert caplog.text.count("could not sweep database") == 3


def test_a_row_coming_due_during_a_pass_ends_the_pause_at_once(app: Celery, clock: Clock) -> None:
    # The pass claims on its clock reading; the wait is computed on a later one. A row due
    # in between was neither claimed (not yet due) nor is it "due after now": the loop
    # must not sleep the whole poll over it.
    store = CountingStore(clock)
    loop = loop_of(app, store, clock)
    park(app, store, START + timedelta(milliseconds=50))
    assert loop._pass(0.2, 0, [None]) == (0.2, 0)
    clock.now = START + timedelta(milliseconds=60)
    assert loop._until_due(0.2, [None]) == 0.0
