"""Atomic tasks on the worker (in-memory store): the body, its dispatches and its
``CompletedTask`` row commit together once per task id; failures and ``retry()`` roll
back first; duplicates are skipped with a signal.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import Ignore, Retry

from celery_outbox import OutboxTask, Sweeper
from celery_outbox.config import OutboxConfig
from celery_outbox.dispatch.target import dispatch_alias
from celery_outbox.exceptions import AtomicUnsupported, OutboxConfigError
from celery_outbox.registry import install_store
from celery_outbox.relay.relay import relay_for
from celery_outbox.signals import task_duplicate_skipped
from celery_outbox.task import check_app
from celery_outbox.testing import InMemoryOutboxStore
from celery_outbox.worker.atomic import check_atomic, serialise_result
from celery_outbox.worker.attempt import USING_HEADER
from tests.unit.worker.support import deliver, queued, queued_tasks


@pytest.fixture
def app(queue_name: str) -> Iterator[Celery]:
    app = Celery("atomic-unit", broker="memory://", set_as_current=False)
    app.conf.update(task_default_queue=queue_name, outbox_park_after=30.0)
    yield app
    app.close()


@pytest.fixture
def store(app: Celery) -> InMemoryOutboxStore:
    store = InMemoryOutboxStore()
    install_store(app, store)
    return store


@pytest.fixture
def effects() -> list[Any]:
    return []


@pytest.fixture
def tasks(app: Celery, store: InMemoryOutboxStore, effects: list[Any]) -> dict[str, Any]:
    """``add`` writes a follow-up and returns its argument; ``boom`` fails after a
    dispatch; ``again`` calls ``self.retry()``; ``odd`` returns an unserialisable value.
    """

    @app.task(base=OutboxTask, name="unit_atomic.follow", shared=False)
    def follow(n: int) -> None:
        effects.append(("follow", n))

    @app.task(base=OutboxTask, name="unit_atomic.add", shared=False, atomic=True)
    def add(n: int) -> int:
        effects.append(("add", n))
        follow.delay(n)
        return n

    @app.task(base=OutboxTask, name="unit_atomic.boom", shared=False, atomic=True)
    def boom(n: int) -> None:
        follow.delay(n)
        raise ValueError("boom")

    @app.task(base=OutboxTask, name="unit_atomic.again", shared=False, atomic=True, bind=True)
    def again(self: OutboxTask, n: int) -> None:
        follow.delay(n)
        raise self.retry(countdown=1)

    @app.task(base=OutboxTask, name="unit_atomic.odd", shared=False, atomic=True)
    def odd() -> object:
        follow.delay(0)
        return object()

    return {"add": add, "boom": boom, "again": again, "odd": odd}


def follow_rows(store: InMemoryOutboxStore) -> list[str]:
    return [row.task_name for row in store.rows.values() if row.task_name == "unit_atomic.follow"]


def test_the_body_its_dispatch_and_its_row_commit_together(
    tasks: dict[str, Any], store: InMemoryOutboxStore, effects: list[Any], queue_name: str
) -> None:
    assert deliver(tasks["add"], 7) == 7
    assert effects == [("add", 7)]
    completion = store.completion("t1")
    assert completion is not None
    assert (completion.task_name, json.loads(completion.result or "")) == ("unit_atomic.add", 7)
    assert store.count_completed() == 1
    # the follow-up was written in the same transaction and published after it
    assert queued_tasks(queue_name) == [("unit_atomic.follow", (7,))]


def test_a_duplicate_is_skipped_with_the_signal(
    tasks: dict[str, Any], store: InMemoryOutboxStore, effects: list[Any]
) -> None:
    skipped: list[dict[str, Any]] = []

    def on_skip(sender: Any, **kwargs: Any) -> None:
        skipped.append({"sender": sender, **kwargs})

    task_duplicate_skipped.connect(on_skip, weak=False)
    try:
        deliver(tasks["add"], 1)
        with pytest.raises(Ignore):
            deliver(tasks["add"], 1)
    finally:
        task_duplicate_skipped.disconnect(on_skip)
    assert effects == [("add", 1)]
    completion = store.completion("t1")
    assert completion is not None
    assert skipped == [
        {
            "sender": tasks["add"],
            "signal": task_duplicate_skipped,
            "task_id": "t1",
            "completed_at": completion.completed_at,
        }
    ]


def test_a_failure_rolls_back_the_dispatch_then_retries(
    tasks: dict[str, Any], store: InMemoryOutboxStore, queue_name: str
) -> None:
    with pytest.raises(Retry):
        deliver(tasks["boom"], 3, queue=queue_name)
    assert follow_rows(store) == []  # the body's dispatch rolled back
    assert store.completion("t1") is None
    (headers,) = queued(queue_name)  # the retry was written after the rollback
    assert (headers["id"], headers["retries"], headers["task"]) == ("t1", 1, "unit_atomic.boom")


def test_retry_inside_the_body_is_written_after_the_rollback(
    tasks: dict[str, Any], store: InMemoryOutboxStore, queue_name: str
) -> None:
    with pytest.raises(Retry) as raised:
        deliver(tasks["again"], 4, queue=queue_name)
    assert type(raised.value) is Retry  # the deferred retry was carried out, not leaked
    assert follow_rows(store) == []
    assert store.completion("t1") is None
    (headers,) = queued(queue_name)
    assert (headers["id"], headers["retries"]) == ("t1", 1)


def test_an_unserialisable_result_fails_the_attempt_and_names_the_task(
    tasks: dict[str, Any], store: InMemoryOutboxStore, queue_name: str, caplog: Any
) -> None:
    with pytest.raises(Retry):
        deliver(tasks["odd"], queue=queue_name)
    assert follow_rows(store) == []
    assert store.completion("t1") is None
    assert len(queued(queue_name)) == 1
    with pytest.raises(Exception, match=r"atomic task 'unit_atomic.odd' returned <object"):
        serialise_result(tasks["odd"], object())


def test_a_concurrent_duplicate_waits_then_is_skipped_or_runs_after_a_rollback(
    app: Celery, store: InMemoryOutboxStore
) -> None:
    started, release, runs = threading.Event(), threading.Event(), []
    fail_first = [True]

    @app.task(base=OutboxTask, name="unit_atomic.slow", shared=False, atomic=True, max_retries=0)
    def slow() -> None:
        runs.append(threading.current_thread().name)
        started.set()
        release.wait(5)
        if fail_first.pop() if fail_first else False:
            raise KeyError("first run fails")

    outcomes: dict[str, str] = {}

    def run(name: str) -> None:
        try:
            deliver(slow, task_id="same")
            outcomes[name] = "ran"
        except Ignore:
            outcomes[name] = "skipped"
        except Exception as exc:
            outcomes[name] = type(exc).__name__

    first = threading.Thread(target=run, args=("first",), name="first")
    first.start()
    assert started.wait(5)
    second = threading.Thread(target=run, args=("second",), name="second")
    second.start()
    time.sleep(0.2)
    assert runs == ["first"]  # the duplicate waits on the key
    release.set()
    first.join(5)
    second.join(5)
    assert outcomes == {"first": "KeyError", "second": "ran"}  # rollback: the duplicate ran
    assert runs == ["first", "second"]
    fail_first.append(False)
    with pytest.raises(Ignore):
        deliver(slow, task_id="same")  # committed now: skipped


def test_check_refuses_a_store_that_cannot_run_atomic_tasks(
    app: Celery, tasks: dict[str, Any]
) -> None:
    class Plain(InMemoryOutboxStore):
        def atomic_problem(self, using: str | None = None) -> str | None:
            return "no transactions here"

    install_store(app, Plain())

    @app.task(base=OutboxTask, name="unit_atomic.elsewhere", shared=False, atomic=True)
    def elsewhere() -> None: ...

    with pytest.raises(
        AtomicUnsupported, match=r"'unit_atomic.elsewhere' is atomic.*'reports'.*no transactions"
    ):
        elsewhere.apply_async(using="reports")
    # Every atomic task of the app, each named, in one error (with any bad retry options
    # of other tasks the process registered with every app: OutboxConfigError then).
    with pytest.raises(OutboxConfigError) as refused:
        check_app(app)
    for name in (
        "unit_atomic.add",
        "unit_atomic.boom",
        "unit_atomic.again",
        "unit_atomic.odd",
        "unit_atomic.elsewhere",
    ):
        assert f"Task {name!r} is atomic, but cannot run on database 'default'" in str(
            refused.value
        )


def test_check_refuses_bad_atomic_options(app: Celery, store: InMemoryOutboxStore) -> None:
    @app.task(base=OutboxTask, name="unit_atomic.yes", shared=False, atomic="yes")
    def yes() -> None: ...

    @app.task(base=OutboxTask, name="unit_atomic.alias", shared=False, atomic=True, atomic_using=3)
    def alias() -> None: ...

    with pytest.raises(AtomicUnsupported, match=r"'unit_atomic.yes': atomic='yes'.*True or False"):
        check_atomic(yes)
    with pytest.raises(AtomicUnsupported, match=r"'unit_atomic.alias': atomic_using=3"):
        check_atomic(alias)


def test_the_sweep_purges_completed_rows_past_the_window(
    app: Celery, store: InMemoryOutboxStore
) -> None:
    now = datetime.now(timezone.utc)
    for n, age in enumerate((10, 100, 100)):
        with store.complete_once(f"t{n}", "unit_atomic.add", now=now - timedelta(seconds=age)):
            pass
    app.conf.outbox_keep_completed = 50.0
    config = OutboxConfig.from_celery(app)
    sweeper = Sweeper(app=app, store=store, relay=relay_for(app), config=config)
    report = sweeper.sweep_all()
    assert report.purged_completed == 2
    assert sorted(store.completions) == ["t0"]


def test_the_body_runs_and_dispatches_on_the_alias_it_was_dispatched_with(
    app: Celery, store: InMemoryOutboxStore
) -> None:
    seen: list[str | None] = []

    @app.task(base=OutboxTask, name="unit_atomic.where", shared=False, atomic=True)
    def where() -> None:
        seen.append(dispatch_alias(None))
        seen.append(dispatch_alias("explicit"))

    @app.task(
        base=OutboxTask, name="unit_atomic.pinned", shared=False, atomic=True, atomic_using="b"
    )
    def pinned() -> None:
        seen.append(dispatch_alias(None))

    deliver(where, task_id="w1", **{USING_HEADER: "reports"})
    deliver(where, task_id="w2")
    deliver(pinned, task_id="p1")
    assert seen == ["reports", "explicit", None, "explicit", "b"]
    assert dispatch_alias(None) is None  # nothing left behind after the runs


class _DownStore(InMemoryOutboxStore):
    """The in-memory store whose database refuses the atomic transaction's first statement."""

    def complete_once(self, *args: Any, **kwargs: Any) -> Any:
        from celery_outbox.exceptions import StoreError

        raise StoreError("celery-outbox could not start an atomic task: database down")


def test_a_store_that_cannot_open_the_transaction_spends_no_retry(
    app: Celery, tasks: dict[str, Any], effects: list[Any], queue_name: str
) -> None:
    from celery_outbox.worker.attempt import REQUEUES_HEADER

    install_store(app, _DownStore())
    with pytest.raises(Ignore):  # acknowledged: the same message is put back with an ETA
        deliver(tasks["add"], 5, queue=queue_name)
    assert effects == []
    (headers,) = queued(queue_name)
    assert (headers["id"], headers["retries"]) == ("t1", 0)  # no retry spent
    assert headers[REQUEUES_HEADER] == 1
    assert headers["eta"] is not None
