"""Atomic tasks on the Django store, beyond the contract (tests/contract/test_completions.py):
the table and its indexes, the alias a body's dispatches join, errors, and an atomic task
run in-process the way a worker runs one delivery.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import Ignore
from django.db import IntegrityError, connection, connections, transaction
from kombu import Connection, Queue

from celery_outbox import OutboxTask
from celery_outbox import signals as core_signals
from celery_outbox.exceptions import AtomicUnsupported, StoreDataError
from celery_outbox.registry import install_store
from celery_outbox.store.records import COMPLETED_TABLE
from celery_outbox.worker.attempt import USING_HEADER
from django_outbox import signals
from django_outbox.models import CompletedTask, OutboxMessage
from django_outbox.store import DjangoOutboxStore
from django_outbox.store.rows import stored_message
from tests.contract.factories import new_message
from tests.contract.harness import DjangoHarness
from tests.django.completion_races import (
    test_duplicates_waiting_on_a_run_that_rolls_back_never_fail as race,
)

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
BOTH = pytest.mark.django_db(transaction=True, databases=["default", "other"])


@pytest.fixture
def store() -> DjangoOutboxStore:
    return DjangoOutboxStore()


@pytest.mark.django_db
def test_the_table_has_the_shared_indexes_and_a_unique_task_id() -> None:
    assert CompletedTask._meta.db_table == COMPLETED_TABLE
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, COMPLETED_TABLE)
    assert found["celery_outbox_completed_at_idx"]["columns"] == ["completed_at"]
    assert found["celery_outbox_completed_name_idx"]["columns"] == ["task_name"]
    assert any(c["unique"] and c["columns"] == ["task_id"] for c in found.values())
    CompletedTask.objects.create(task_id="t", task_name="n", completed_at=NOW)
    with pytest.raises(IntegrityError), transaction.atomic():
        CompletedTask.objects.create(task_id="t", task_name="other", completed_at=NOW)
    assert str(CompletedTask.objects.get()) == "n[t] completed 2026-01-02 03:04:05"


def test_the_duplicate_signal_is_resent_as_a_django_signal() -> None:
    received: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        received.append({"sender": sender, **kwargs})

    signals.task_duplicate_skipped.connect(receiver)
    try:
        signals.connect()
        core_signals.task_duplicate_skipped.send(sender="task", task_id="t", completed_at=NOW)
    finally:
        signals.task_duplicate_skipped.disconnect(receiver)
    assert received == [
        {
            "sender": "task",
            "signal": signals.task_duplicate_skipped,
            "task_id": "t",
            "completed_at": NOW,
        }
    ]


def test_an_unknown_alias_is_a_problem_naming_it_and_the_known_ones(
    store: DjangoOutboxStore,
) -> None:
    assert store.atomic_problem(None) is None
    assert store.atomic_problem("other") is None
    assert store.atomic_problem("nope") == (
        "no database alias 'nope' in DATABASES (aliases: default, other)"
    )
    with pytest.raises(AtomicUnsupported, match=r"'tests.atomic' cannot run: no database alias"):
        store.complete_once("t", "tests.atomic", now=NOW, using="nope").__enter__()


@pytest.mark.django_db(transaction=True)
def test_a_task_id_too_long_for_the_column_is_refused_naming_it(store: DjangoOutboxStore) -> None:
    with (
        pytest.raises(StoreDataError, match=r"task id 'xxxx.*at most 255 characters"),
        store.complete_once("x" * 256, "tests.atomic", now=NOW),
    ):
        pytest.fail("the body must not run")
    assert not CompletedTask.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_the_bodys_own_database_error_leaves_unchanged(store: DjangoOutboxStore) -> None:
    CompletedTask.objects.create(task_id="taken", task_name="n", completed_at=NOW)
    with (
        pytest.raises(IntegrityError),
        store.complete_once("t", "tests.atomic", now=NOW),
    ):
        CompletedTask.objects.create(task_id="taken", task_name="n", completed_at=NOW)
    assert list(CompletedTask.objects.values_list("task_id", flat=True)) == ["taken"]


@BOTH
def test_writes_and_callbacks_with_using_none_join_the_atomic_alias(
    store: DjangoOutboxStore,
) -> None:
    published: list[list[str]] = []
    message = new_message()
    with store.complete_once("t", "tests.atomic", now=NOW, using="other"):
        assert connections["other"].in_atomic_block
        assert not connections["default"].in_atomic_block
        row_id = store.add(message)
        row = stored_message(OutboxMessage.objects.using("other").get(pk=row_id))
        store.defer_publish(row, record_into(published))
        store.on_commit(lambda: published.append(["on_commit"]))
        assert published == []  # both wait for the commit of "other"
    assert published == [[message.task_id], ["on_commit"]]
    assert not OutboxMessage.objects.using("default").exists()
    assert CompletedTask.objects.using("other").filter(task_id="t").exists()
    assert not CompletedTask.objects.using("default").exists()
    # After the block, using=None is "default" again.
    store.on_commit(lambda: published.append(["default"]))
    assert published[-1] == ["default"]


def record_into(calls: list[list[str]]) -> Any:
    def publish(messages: Any) -> None:
        calls.append([m.task_id for m in messages])

    return publish


def queued_tasks(queue_name: str) -> list[tuple[str, tuple[Any, ...]]]:
    """The tasks waiting in ``queue_name`` of the in-memory broker (taken off it)."""
    with Connection("memory://") as conn:
        queue = Queue(queue_name)(conn.default_channel)
        found = []
        while (message := queue.get(no_ack=True)) is not None:
            args, _kwargs, _embed = message.decode()
            found.append((message.headers["task"], tuple(args)))
        return found


@pytest.fixture
def app(store: DjangoOutboxStore) -> Iterator[Celery]:
    app = Celery("django-atomic", broker="memory://", set_as_current=False)
    app.conf.update(task_default_queue=f"django-atomic-{uuid.uuid4()}", outbox_park_after=30.0)
    install_store(app, store)
    yield app
    app.close()


def deliver(task: Any, *args: Any, task_id: str, using: str | None = None) -> Any:
    """Run ``task`` as a worker runs one delivery of ``task_id`` dispatched with ``using``."""
    task.push_request(
        id=task_id,
        args=args,
        kwargs={},
        retries=0,
        is_eager=False,
        called_directly=False,
        delivery_info={
            "exchange": "",
            "routing_key": task.app.conf.task_default_queue,
            "redelivered": False,
        },
        **({USING_HEADER: using} if using else {}),
    )
    try:
        return task(*args)
    finally:
        task.pop_request()


@BOTH
def test_an_atomic_task_on_the_second_alias_runs_once_with_its_follow_up(app: Celery) -> None:
    from django.contrib.auth.models import User

    @app.task(base=OutboxTask, name="atomic.follow", shared=False)
    def follow(name: str) -> None:
        """Never run here: only its outbox row matters."""

    @app.task(base=OutboxTask, name="atomic.signup", shared=False, atomic=True)
    def signup(name: str) -> int:
        user = User.objects.db_manager("other").create(username=name)
        follow.delay(name)  # using=None: joins the task's transaction on "other"
        rows = OutboxMessage.objects.using("other").filter(task_name="atomic.follow")
        written.append(rows.count())
        return int(user.pk)

    skipped: list[str] = []
    written: list[int] = []

    def on_skip(sender: Any, task_id: str, **kwargs: Any) -> None:
        skipped.append(task_id)

    signals.connect()
    signals.task_duplicate_skipped.connect(on_skip)
    try:
        user_id = deliver(signup, "ann", task_id="signup-1", using="other")
        with pytest.raises(Ignore):
            deliver(signup, "ann", task_id="signup-1", using="other")
    finally:
        signals.task_duplicate_skipped.disconnect(on_skip)
    assert skipped == ["signup-1"]
    assert list(User.objects.using("other").values_list("pk", flat=True)) == [user_id]
    completion = DjangoOutboxStore().completion("signup-1", using="other")
    assert completion is not None
    assert (completion.task_name, json.loads(completion.result or "")) == (
        "atomic.signup",
        user_id,
    )
    assert written == [1]  # the follow-up's row, in the task's transaction on "other"
    assert queued_tasks(app.conf.task_default_queue) == [("atomic.follow", ("ann",))]
    assert not OutboxMessage.objects.using("default").exists()
    assert not CompletedTask.objects.using("default").exists()


@pytest.mark.django_db
def test_dispatching_an_atomic_task_to_an_unknown_alias_names_the_task_and_alias(
    app: Celery,
) -> None:
    @app.task(base=OutboxTask, name="atomic.elsewhere", shared=False, atomic=True)
    def elsewhere() -> None:
        """Never runs."""

    @app.task(base=OutboxTask, name="atomic.pinned", shared=False, atomic=True, atomic_using="gone")
    def pinned() -> None:
        """Never runs."""

    with pytest.raises(AtomicUnsupported) as caught:
        elsewhere.apply_async(using="nope")
    assert str(caught.value) == (
        "Task 'atomic.elsewhere' is atomic, but cannot run on database 'nope': no database "
        "alias 'nope' in DATABASES (aliases: default, other)."
    )
    with pytest.raises(AtomicUnsupported, match=r"'atomic.pinned' .* database 'gone': no data"):
        pinned.delay()
    assert not OutboxMessage.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_duplicates_waiting_on_a_run_that_rolls_back_never_fail() -> None:
    race(DjangoHarness())


@pytest.mark.parametrize(
    ("vendor", "sqlite_version", "says"),
    [
        ("oracle", (3, 45, 0), "database 'default' is oracle: atomic tasks run on PostgreSQL,"),
        ("sqlite", (3, 22, 0), "database 'default' is SQLite 3.22.0: atomic tasks need SQLite"),
    ],
)
def test_a_database_that_cannot_run_atomic_tasks_is_a_problem_naming_it(
    store: DjangoOutboxStore,
    monkeypatch: pytest.MonkeyPatch,
    vendor: str,
    sqlite_version: tuple[int, int, int],
    says: str,
) -> None:
    monkeypatch.setattr(connections["default"], "vendor", vendor)
    monkeypatch.setattr(sqlite3, "sqlite_version_info", sqlite_version)
    monkeypatch.setattr(sqlite3, "sqlite_version", ".".join(map(str, sqlite_version)))
    problem = store.atomic_problem(None)
    assert problem is not None
    assert problem.startswith(says)
