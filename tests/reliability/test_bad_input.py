"""Bad input: each is a clear error (at the call site, or a ``failed`` row) and loses nothing.

Every test dispatches good tasks around the bad one, in the same transaction or the same
sweep, and counts them on the broker: the bad input must not cost a good task, and must
not be published twice. The database is PostgreSQL (SQLAlchemy store), the broker Redis.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from celery import Celery, Task
from kombu import Connection
from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from celery_outbox import (
    ArgumentsMismatch,
    OutboxConfigError,
    OutboxError,
    OutboxTask,
    PayloadError,
    install_store,
    requeue,
)
from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore, dead_letter_table, outbox_table
from celery_outbox.store.base import PublishCallback
from celery_outbox.store.records import StoredMessage
from celery_outbox.sweep_task import sweep_app
from tests.brokers import celery_queue
from tests.reliability.app import RECORD, create_app, create_tables, expected_table
from tests.reliability.conftest import RecordResult
from tests.reliability.harness import ScenarioEnv, settle

RETIRED = "reliability.retired"


def retired() -> None:
    """A task the producer knows and the sweeper's app does not (it was removed)."""


def noop(key: str) -> None:
    """A task body for apps that never run it."""


class ProducerDiedStore(SQLAlchemyOutboxStore):
    """A store whose on-commit publish never happens: the producer died after COMMIT."""

    def defer_publish(
        self, message: StoredMessage, publish: PublishCallback, *, using: str | None = None
    ) -> None:
        pass


@dataclass
class Outbox:
    """One test's app, store and queue, and a way to read what reached the broker."""

    env: ScenarioEnv
    app: Celery
    store: SQLAlchemyOutboxStore

    def task(self, name: str = RECORD) -> Task[Any, Any]:
        return self.app.tasks[name]

    def app_with(self, **conf: Any) -> tuple[Celery, SQLAlchemyOutboxStore]:
        """Another app on the same broker, database and queue, with settings ``conf``."""
        return create_app(
            broker=self.env.broker,
            db_url=self.env.db_url,
            queue=self.env.queue,
            ledger_dir=str(self.env.ledger_dir),
            **conf,
        )

    @contextmanager
    def transaction(self, store: SQLAlchemyOutboxStore | None = None) -> Iterator[Session]:
        """A session in a transaction, bound to ``store`` (default: the test's store)."""
        store = store or self.store
        with Session(store.engine) as session, session.begin(), store.bind_session(session):
            yield session

    def published(self) -> Counter[str]:
        """The task ids of every message now in the queue (consumed)."""
        ids: Counter[str] = Counter()
        with Connection(self.env.broker, connect_timeout=5) as conn:
            queue = celery_queue(self.env.queue)(conn.default_channel)
            queue.declare()
            while (message := queue.get(no_ack=True)) is not None:
                ids[message.headers["id"]] += 1
        return ids

    def rows(self) -> dict[str, dict[str, Any]]:
        """The outbox rows left, by task id."""
        with self.store.engine.connect() as conn:
            return {row.task_id: dict(row._mapping) for row in conn.execute(select(outbox_table))}


@pytest.fixture
def outbox(
    redis_url: str,
    redis_queue: str,
    postgres_database_url: str,
    make_scenario_env: Callable[..., ScenarioEnv],
) -> Iterator[Outbox]:
    env = make_scenario_env(broker=redis_url, db_url=postgres_database_url)
    app, store = create_app(
        broker=env.broker, db_url=env.db_url, queue=env.queue, ledger_dir=str(env.ledger_dir)
    )
    create_tables(store.engine)
    yield Outbox(env=env, app=app, store=store)
    store.engine.dispose()


def _record(
    record_result: RecordResult,
    scenario: str,
    title: str,
    *,
    good: set[str],
    published: Counter[str],
    notes: str = "",
) -> None:
    lost = good - set(published)
    record_result(
        scenario,
        title=title,
        tasks=len(good),
        lost=len(lost),
        duplicates=sum(published.values()) - len(published),
        notes=notes,
    )
    assert not lost, f"good tasks lost: {sorted(lost)}"
    assert all(count == 1 for count in published.values()), published


def test_unserialisable_args_fail_at_the_call_site_and_the_transaction_goes_on(
    outbox: Outbox,
    record_result: RecordResult,
) -> None:
    record = outbox.task()
    with outbox.transaction() as session:
        record.apply_async(("before",), task_id="before")
        with pytest.raises(PayloadError, match=r"'reliability\.record'.*cannot be serialised"):
            record.apply_async((object(),), task_id="bad")
        record.apply_async(("after",), task_id="after")
        session.execute(insert(expected_table), [{"key": "before"}, {"key": "after"}])

    published = outbox.published()
    assert "bad" not in published
    assert "bad" not in outbox.rows()
    _record(
        record_result,
        "bad_input_unserialisable_args",
        "Unserialisable args (bad input)",
        good={"before", "after"},
        published=published,
        notes="PayloadError at the call site; same transaction commits the others",
    )


def test_payload_above_the_limit_fails_at_the_call_site(
    outbox: Outbox,
    record_result: RecordResult,
) -> None:
    app, store = outbox.app_with(outbox_max_payload_bytes=1024)
    record = app.tasks[RECORD]
    with outbox.transaction(store):
        with pytest.raises(PayloadError, match=r"above outbox_max_payload_bytes=1024"):
            record.apply_async(("x" * 2000,), task_id="big")
        record.apply_async(("small",), task_id="small")

    published = outbox.published()
    assert "big" not in published
    assert "big" not in outbox.rows()
    _record(
        record_result,
        "bad_input_payload_too_large",
        "Payload above outbox_max_payload_bytes (bad input)",
        good={"small"},
        published=published,
        notes="PayloadError naming the limit at the call site",
    )
    store.engine.dispose()


def _write_unpublished(outbox: Outbox, calls: list[tuple[str, str]]) -> None:
    """Commit rows for ``(task name, key)`` whose producer "dies" before publishing them.

    With no publish grace, as the sweep below: the rows are born leased to their
    on-commit publisher for that long, and no sweep takes them before.
    """
    app, store = outbox.app_with(outbox_publish_grace=0.0)
    app.task(name=RETIRED, base=OutboxTask, shared=False)(retired)
    died = ProducerDiedStore(engine=store.engine)
    install_store(app, died)
    with outbox.transaction(died):
        for name, key in calls:
            app.tasks[name].apply_async((key,) if name == RECORD else (), task_id=key)


def _sweep(outbox: Outbox) -> dict[str, Any]:
    app, store = outbox.app_with(outbox_publish_grace=0.0)
    try:
        return sweep_app(app).as_dict()
    finally:
        store.engine.dispose()


def test_unregistered_task_at_publish_time_is_failed_and_the_sweep_goes_on(
    outbox: Outbox,
    record_result: RecordResult,
) -> None:
    calls = [
        (RETIRED, "retired-1"),
        (RECORD, "good-1"),
        (RETIRED, "retired-2"),
        (RECORD, "good-2"),
        (RECORD, "good-3"),
    ]
    _write_unpublished(outbox, calls)

    report = _sweep(outbox)

    rows = outbox.rows()
    for key in ("retired-1", "retired-2"):
        assert rows[key]["status"] == "failed", rows[key]
        assert f"task {RETIRED!r} is not registered" in rows[key]["last_error"]
    assert (report["failed"], report["published"]) == (2, 3), report
    _record(
        record_result,
        "bad_input_unregistered_task",
        "Unregistered task name at publish time (bad input)",
        good={"good-1", "good-2", "good-3"},
        published=outbox.published(),
        notes="rows marked failed ('is not registered'); the sweep publishes the rest",
    )


@pytest.mark.parametrize(
    ("column", "value"),
    [
        pytest.param("payload", '{"not json', id="payload"),
        pytest.param("options", {"headers": "not a mapping"}, id="options"),
    ],
)
def test_corrupted_row_is_failed_and_the_sweep_goes_on(
    outbox: Outbox,
    record_result: RecordResult,
    column: str,
    value: Any,
) -> None:
    _write_unpublished(outbox, [(RECORD, "good-1"), (RECORD, "corrupt"), (RECORD, "good-2")])
    with outbox.store.engine.begin() as conn:
        conn.execute(
            update(outbox_table).where(outbox_table.c.task_id == "corrupt").values({column: value})
        )

    report = _sweep(outbox)

    row = outbox.rows()["corrupt"]
    assert row["status"] == "failed", row
    assert row["last_error"], row
    assert (report["failed"], report["published"]) == (1, 2), report
    published = outbox.published()
    assert "corrupt" not in published
    _record(
        record_result,
        f"bad_input_corrupted_{column}",
        f"Corrupted row: invalid {column} written by raw SQL (bad input)",
        good={"good-1", "good-2"},
        published=published,
        notes=f"marked failed: {row['last_error'][:80]}",
    )


def test_negative_countdown_runs_now(outbox: Outbox, record_result: RecordResult) -> None:
    before = datetime.now(timezone.utc)
    with outbox.transaction():
        outbox.task().apply_async(("late",), task_id="late", countdown=-30)

    published = outbox.published()
    assert "late" not in outbox.rows(), "published on commit, not left for later"
    _record(
        record_result,
        "bad_input_negative_countdown",
        "Negative countdown (runs now)",
        good={"late"},
        published=published,
        notes=f"published on commit at {before:%H:%M:%S}, as plain Celery runs it now",
    )


@pytest.mark.parametrize(
    ("option", "value"),
    [
        pytest.param("countdown", 10**12, id="countdown-1e12"),
        pytest.param("countdown", float("inf"), id="countdown-inf"),
        pytest.param("countdown", float("nan"), id="countdown-nan"),
        pytest.param("eta", "99999-01-01T00:00:00+00:00", id="eta-year-99999"),
        pytest.param("expires", 10**12, id="expires-1e12"),
    ],
)
def test_absurd_schedule_is_a_clear_error_at_the_call_site(
    outbox: Outbox,
    option: str,
    value: Any,
) -> None:
    with outbox.transaction():
        with pytest.raises(ValueError, match=re.escape(f"{option}={value!r}")):
            outbox.task().apply_async(("absurd",), task_id="absurd", **{option: value})
        outbox.task().apply_async(("fine",), task_id="fine")
    assert set(outbox.published()) == {"fine"}
    assert not outbox.rows()


def test_naive_eta_is_read_in_the_app_timezone_as_the_worker_reads_it(outbox: Outbox) -> None:
    from kombu.asynchronous.timer import to_timestamp

    app, store = outbox.app_with(timezone="Europe/Paris")
    naive = datetime.now() + timedelta(hours=2)
    with outbox.transaction(store):
        app.tasks[RECORD].apply_async(("naive",), task_id="naive", eta=naive)

    row = outbox.rows()["naive"]
    # What Celery's worker does with a naive eta when the app's timezone is not UTC
    # (celery.worker.strategy: ``to_timestamp(req.eta, app.timezone)``).
    worker_runs_at = to_timestamp(naive, ZoneInfo("Europe/Paris"), time=time.time)
    assert row["available_at"].timestamp() == pytest.approx(worker_runs_at, abs=0.01), (
        f"parked until {row['available_at'].isoformat()}, the worker would run it at "
        f"{datetime.fromtimestamp(worker_runs_at, timezone.utc).isoformat()}"
    )
    store.engine.dispose()


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        pytest.param("outbox_sweep_interval", "5", id="interval-str"),
        pytest.param("outbox_sweep_batch_size", 2.5, id="batch-float"),
        pytest.param("outbox_beat_schedule", "yes", id="flag-str"),
        pytest.param("outbox_max_payload_bytes", -1, id="bytes-negative"),
        pytest.param("outbox_publish_grace", float("nan"), id="grace-nan"),
        pytest.param("outbox_store", 42, id="store-int"),
    ],
)
def test_setting_of_the_wrong_type_names_the_setting(
    outbox: Outbox,
    setting: str,
    value: Any,
) -> None:
    app = Celery("misconfigured", broker=outbox.env.broker, set_as_current=False)
    app.conf.update({setting: value})
    app.task(name=RECORD, base=OutboxTask, shared=False)(noop)
    with pytest.raises(OutboxConfigError, match=re.escape(f"{setting}={value!r}")):
        app.tasks[RECORD].apply_async(("k",), task_id="k")
    assert not outbox.rows()


def test_worker_with_a_setting_of_the_wrong_type_fails_at_start_up(
    outbox: Outbox,
    celery_worker_process: Callable[..., Any],
) -> None:
    from tests.worker import WorkerStartError

    env = {**outbox.env.as_env(), "RELIABILITY_CONF": json.dumps({"outbox_claim_lease": "60"})}
    with pytest.raises(WorkerStartError, match=r"outbox_claim_lease='60'"):
        celery_worker_process(
            "tests.reliability.app", queue=outbox.env.queue, env=env, ready_timeout=30
        )


def test_serializer_defaults_to_json(outbox: Outbox) -> None:
    _write_unpublished(outbox, [(RECORD, "plain")])
    row = outbox.rows()["plain"]
    assert row["options"]["content_type"] == "application/json"
    assert json.loads(row["payload"])[0] == ["plain"]


def test_pickle_is_refused_unless_the_app_accepts_it(outbox: Outbox) -> None:
    """A pickled message the workers do not accept would be dropped by them: refuse it."""
    with outbox.transaction(), pytest.raises(PayloadError, match="pickle"):
        outbox.task().apply_async(("p",), task_id="p", serializer="pickle")
    assert not outbox.rows()
    app, store = outbox.app_with(task_serializer="pickle", accept_content=["json", "pickle"])
    with outbox.transaction(store):
        app.tasks[RECORD].apply_async(("p",), task_id="p")
    assert set(outbox.published()) == {"p"}
    store.engine.dispose()


# -- round 2: bad input met by a running worker ------------------------------------------
RENAMED = "reliability.record_v1"


def old_record(key: str, version: int) -> None:
    """``record`` as the previous version of the code had it: one more parameter."""


def _old_version(outbox: Outbox) -> Celery:
    """An app of the previous deploy: ``record`` took ``version`` too, and
    ``record_v1`` was its name before a rename; same broker, queue and store.
    """
    app = Celery("reliability-old", broker=outbox.env.broker, set_as_current=False)
    app.conf.update(task_default_queue=outbox.env.queue, task_ignore_result=True)
    app.task(name=RECORD, base=OutboxTask, shared=False)(old_record)
    app.task(name=RENAMED, base=OutboxTask, shared=False)(noop)
    install_store(app, outbox.store)
    return app


def _letters(outbox: Outbox) -> dict[str, dict[str, Any]]:
    """The dead letters, by task id."""
    with outbox.store.engine.connect() as conn:
        found = conn.execute(select(dead_letter_table))
        return {row.task_id: dict(row._mapping) for row in found}


def _run_worker_until(
    outbox: Outbox, start: Callable[..., Any], done: set[str], letters: set[str]
) -> None:
    from tests.reliability import ledger

    start("tests.reliability.app", queue=outbox.env.queue, env=outbox.env.as_env())
    settled = settle(
        lambda: (
            set(ledger.events(outbox.env.ledger_dir, ledger.DONE)) >= done
            and set(_letters(outbox)) >= letters
        ),
        timeout=60,
    )
    assert settled, (ledger.events(outbox.env.ledger_dir, ledger.DONE), _letters(outbox))


def test_arguments_of_an_older_version_are_a_dead_letter_at_once_and_the_worker_goes_on(
    outbox: Outbox,
    celery_worker_process: Callable[..., Any],
    record_result: RecordResult,
) -> None:
    from tests.reliability import ledger

    old = _old_version(outbox)
    with outbox.transaction():  # written before the deploy, run after it
        outbox.task().apply_async(("good-1",), task_id="good-1")
        old.tasks[RECORD].apply_async(("stale", 1), task_id="stale")
    _run_worker_until(outbox, celery_worker_process, {"good-1"}, {"stale"})
    with outbox.transaction():
        outbox.task().apply_async(("good-2",), task_id="good-2")
    assert settle(lambda: "good-2" in ledger.events(outbox.env.ledger_dir, ledger.DONE), timeout=30)

    letter = _letters(outbox)["stale"]
    assert letter["exception_type"] == "celery_outbox.exceptions.ArgumentsMismatch"
    assert f"task {RECORD!r} [stale] do not fit its signature" in letter["exception_message"]
    assert "args=('stale', 1)" in letter["exception_message"]
    assert (letter["retries"], letter["args"]) == (0, ["stale", 1])  # never retried, kept
    # Requeued while the code still does not accept them: an error naming the letter.
    with pytest.raises(ArgumentsMismatch, match=rf"dead letter {letter['id']} of task"):
        requeue(outbox.app, letter["id"])
    assert _letters(outbox)["stale"]["status"] == "dead"
    # The previous version's code (or a fixed one) can requeue it: nothing was lost.
    task_id = requeue(old, letter["id"])
    assert _letters(outbox)["stale"]["requeued_task_id"] == task_id
    _record(
        record_result,
        "bad_input_arguments_mismatch",
        "Arguments of an older version (extra arg) met by the worker (bad input)",
        good={"good-1", "good-2"},
        published=ledger.events(outbox.env.ledger_dir, ledger.DONE),
        notes="ArgumentsMismatch dead letter at once (0 retries); requeue refused naming it",
    )


def test_a_task_renamed_between_dispatch_and_run_is_a_dead_letter_and_the_worker_goes_on(
    outbox: Outbox,
    celery_worker_process: Callable[..., Any],
    record_result: RecordResult,
) -> None:
    from tests.reliability import ledger

    old = _old_version(outbox)
    with outbox.transaction():
        old.tasks[RENAMED].apply_async(("renamed",), task_id="renamed")
        outbox.task().apply_async(("good-1",), task_id="good-1")
    _run_worker_until(outbox, celery_worker_process, {"good-1"}, {"renamed"})

    letter = _letters(outbox)["renamed"]
    assert letter["exception_type"] == "celery.exceptions.NotRegistered"
    assert f"task {RENAMED!r} is not registered" in letter["exception_message"]
    assert letter["args"] == ["renamed"]
    # Requeued from the new code, where the name is gone: an error naming it; still dead.
    with pytest.raises(OutboxError, match=rf"dead letter {letter['id']}: task {RENAMED!r}"):
        requeue(outbox.app, letter["id"])
    assert _letters(outbox)["renamed"]["status"] == "dead"
    assert requeue(old, letter["id"])  # from code that knows the name
    _record(
        record_result,
        "bad_input_renamed_task",
        "Task renamed between dispatch and run (bad input)",
        good={"good-1"},
        published=ledger.events(outbox.env.ledger_dir, ledger.DONE),
        notes="dead letter (NotRegistered) with its args; requeue refused until the name exists",
    )
