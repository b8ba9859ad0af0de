"""The relay loop's wake-ups on real PostgreSQL (and SQLite, which polls), SQLAlchemy store.

The loop polls every :data:`POLL` seconds, far beyond every deadline here: a row published
before the deadline was published because a ``NOTIFY`` (or the next parked row's due
time) woke the loop, never because of its poll. Deadlines, not timings: nothing here
measures latency (``benchmarks/latency.py`` does).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import create_engine, text

from celery_outbox import OutboxTask
from celery_outbox.clock import utcnow
from celery_outbox.config import OutboxConfig
from celery_outbox.dispatch.envelope import build_message
from celery_outbox.registry import install_store, store_for
from celery_outbox.relay.loop import Wakeups
from celery_outbox.relay.relay import relay_for
from celery_outbox.relay.sweeper import Sweeper
from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore, metadata
from celery_outbox.store.base import CHANNEL
from celery_outbox.store.records import NewMessage
from tests.integration.sweep_app import RECORD, create_app, create_tables
from tests.integration.sweep_support import drain_task_ids, free_port
from tests.worker import wait_for

#: The loop's poll: a minute, so that only a wake-up publishes within :data:`DEADLINE`.
POLL = 60.0
#: How long a test waits for what a wake-up should do almost at once.
DEADLINE = 20.0
LISTENING = f'LISTEN "{CHANNEL}"'


@pytest.fixture
def outbox_db(postgres_database_url: str) -> str:
    create_tables(postgres_database_url)
    return postgres_database_url


@pytest.fixture
def make_app() -> Iterator[Callable[..., Celery]]:
    apps: list[Celery] = []

    def make(broker_url: str, queue: str, db_url: str, **conf: Any) -> Celery:
        apps.append(create_app(broker_url, queue, db_url, outbox_publish_grace=0, **conf))
        return apps[-1]

    yield make
    for app in apps:
        relay_for(app).close()
        store_for(app).engine.dispose()  # type: ignore[attr-defined]
        app.close()


class RelayLoop:
    """``Sweeper.run`` in a thread; counts its passes (claims of due rows)."""

    def __init__(self, app: Celery, *, poll: float = POLL, listen: bool = True) -> None:
        self.store = store_for(app)
        self.passes = 0
        claim_due = self.store.claim_due

        def counted(**kwargs: Any) -> Any:
            self.passes += 1
            return claim_due(**kwargs)

        self.store.claim_due = counted  # type: ignore[method-assign]
        sweeper = Sweeper(
            app=app, store=self.store, relay=relay_for(app), config=OutboxConfig.from_celery(app)
        )
        self.stop = threading.Event()
        self.thread = threading.Thread(
            target=sweeper.run, args=(self.stop, poll), kwargs={"listen": listen}, daemon=True
        )

    def __enter__(self) -> RelayLoop:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive()


def message(app: Celery, task_id: str, *, eta: datetime | None = None) -> NewMessage:
    """``record.delay(0)`` as written with no on-commit publisher (no lease)."""
    return build_message(
        app.tasks[RECORD],
        (0,),
        {},
        task_id=task_id,
        options={} if eta is None else {"eta": eta},
        now=utcnow(),
        park_after=timedelta(seconds=0),
        max_bytes=None,
    )


def pending(app: Celery) -> int:
    return sum(n for s, n in store_for(app).count_by_status().items() if s.value == "pending")


def listening_backends(db_url: str) -> list[int]:
    """The pids of the backends of ``db_url``'s database that LISTEN for the relay."""
    engine = create_engine(db_url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                    "AND query = :listen AND pid <> pg_backend_pid()"
                ),
                {"listen": LISTENING},
            )
            return [int(pid) for (pid,) in rows]
    finally:
        engine.dispose()


def terminate(db_url: str, pid: int) -> None:
    engine = create_engine(db_url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar()
    finally:
        engine.dispose()


# -- the relay loop -------------------------------------------------------------------------
def test_a_notify_wakes_the_relay_long_before_its_poll(
    make_app: Any, redis_url: str, queue_name: str, outbox_db: str
) -> None:
    app = make_app(redis_url, queue_name, outbox_db)
    with RelayLoop(app) as loop:
        # The first pass, then the one right after LISTEN started: now it waits POLL.
        wait_for(lambda: loop.passes >= 2, timeout=DEADLINE, what="the relay's LISTEN")
        wait_for(lambda: bool(listening_backends(outbox_db)), timeout=DEADLINE, what="LISTEN")
        store_for(app).add(message(app, "woken"))  # committed at once; no on-commit publish
        wait_for(lambda: pending(app) == 0, timeout=DEADLINE, what="the NOTIFY")
    assert drain_task_ids(redis_url, queue_name) == Counter({"woken": 1})


def test_a_parked_row_is_published_when_due_without_a_notify(
    make_app: Any, redis_url: str, queue_name: str, outbox_db: str
) -> None:
    app = make_app(redis_url, queue_name, outbox_db)
    store_for(app).add(message(app, "parked", eta=utcnow() + timedelta(seconds=2)))
    with RelayLoop(app, listen=False) as loop:
        wait_for(lambda: loop.passes >= 1, timeout=DEADLINE, what="the first pass")
        assert pending(app) == 1  # not due yet
        wait_for(lambda: pending(app) == 0, timeout=DEADLINE, what="the due time")
    assert drain_task_ids(redis_url, queue_name) == Counter({"parked": 1})


def test_the_relay_polls_when_it_cannot_listen(
    make_app: Any,
    redis_url: str,
    queue_name: str,
    outbox_db: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = make_app(redis_url, queue_name, outbox_db)
    nowhere = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/none"
    unreachable = SQLAlchemyOutboxStore(engine=create_engine(nowhere))
    monkeypatch.setattr(
        store_for(app), "listen_connector", lambda using=None: unreachable.listen_connector()
    )
    caplog.set_level(logging.WARNING, logger="celery_outbox.relay.loop")
    with RelayLoop(app, poll=0.1):
        store_for(app).add(message(app, "polled"))
        wait_for(lambda: pending(app) == 0, timeout=DEADLINE, what="a poll")
    assert "cannot LISTEN for new outbox rows" in caplog.text
    assert drain_task_ids(redis_url, queue_name) == Counter({"polled": 1})


def test_the_relay_keeps_publishing_when_its_listen_connection_is_killed(
    make_app: Any, redis_url: str, queue_name: str, outbox_db: str
) -> None:
    app = make_app(redis_url, queue_name, outbox_db)
    with RelayLoop(app, poll=0.1):
        wait_for(lambda: bool(listening_backends(outbox_db)), timeout=DEADLINE, what="LISTEN")
        terminate(outbox_db, listening_backends(outbox_db)[0])
        store_for(app).add(message(app, "after-the-kill"))
        wait_for(lambda: pending(app) == 0, timeout=DEADLINE, what="a poll")
    assert drain_task_ids(redis_url, queue_name) == Counter({"after-the-kill": 1})


def identity(n: int) -> int:
    return n


def test_sqlite_keeps_polling(redis_url: str, queue_name: str, sqlite_url: str) -> None:
    app = Celery("notify-sqlite", broker=redis_url, set_as_current=False)
    app.conf.update(task_default_queue=queue_name, outbox_publish_grace=0)
    app.task(base=OutboxTask, name=RECORD, shared=False)(identity)
    engine = create_engine(sqlite_url)
    metadata.create_all(engine)
    store = SQLAlchemyOutboxStore(engine=engine)
    install_store(app, store)
    assert store.listen_connector() is None
    try:
        with RelayLoop(app, poll=0.1):
            store.add(message(app, "on-sqlite"))
            wait_for(lambda: pending(app) == 0, timeout=DEADLINE, what="a poll")
    finally:
        relay_for(app).close()
        engine.dispose()
        app.close()
    assert drain_task_ids(redis_url, queue_name) == Counter({"on-sqlite": 1})


# -- the wait itself --------------------------------------------------------------------------
class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_lost_listen_connection_ends_the_wait_then_polls_until_listening_again(
    make_app: Any, outbox_db: str
) -> None:
    app = make_app("memory://", "unused", outbox_db)
    store = store_for(app)
    connect = store.listen_connector()
    assert connect is not None
    clock, stop = FakeClock(), threading.Event()
    wakeups = Wakeups([connect], retry=30.0, clock=clock)
    try:
        assert wakeups.wait(0.0, stop) is True  # a new LISTEN: the caller sweeps
        assert wakeups.listening == 1
        [pid] = listening_backends(outbox_db)
        terminate(outbox_db, pid)
        assert wakeups.wait(POLL, stop) is True  # the loss ends the wait at once
        assert wakeups.listening == 0
        assert wakeups.wait(0.01, stop) is False  # polling until the retry time
        assert listening_backends(outbox_db) == []
        clock.now += 30.0
        assert wakeups.wait(0.0, stop) is True  # listening again
        assert wakeups.listening == 1
        store.add(message(app, "after-the-loss"))
        assert wakeups.wait(POLL, stop) is True  # and woken by the next NOTIFY
    finally:
        wakeups.close()
    assert listening_backends(outbox_db) == []


def test_rows_born_leased_to_their_on_commit_publisher_notify_nobody(
    make_app: Any, outbox_db: str
) -> None:
    app = make_app("memory://", "unused", outbox_db)
    store = store_for(app)
    connect = store.listen_connector()
    assert connect is not None
    stop = threading.Event()
    wakeups = Wakeups([connect])
    try:
        assert wakeups.wait(0.0, stop) is True
        leased = replace(message(app, "leased"), locked_until=utcnow() + timedelta(hours=1))
        store.add(leased)
        stop_soon = threading.Timer(1.0, stop.set)  # ends the wait: no notification came
        stop_soon.start()
        assert wakeups.wait(POLL, stop) is False
    finally:
        wakeups.close()
