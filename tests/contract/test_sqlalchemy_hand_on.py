"""A successor an atomic run hands on, written with the run's last writes (SQLAlchemy).

On PostgreSQL the row rides on the run's last statement (its result and workflow count)
and its publish is deferred to the commit: a run that commits has the row and publishes
it; one that rolls back has neither; a pending row of the same task id keeps its place
(nothing written, nothing published), as ``add`` would. Elsewhere, or in a savepoint, the
store does not take it (the caller adds it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import pytest

pytest.importorskip("sqlalchemy")

from sqlalchemy import Engine, event, select
from sqlalchemy.orm import Session

from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore
from celery_outbox.store.records import NewMessage, StoredMessage
from tests.contract.factories import LEASE, NOW, new_message

OUTBOX = "celery_outbox_message"


@pytest.fixture
def store(pg_engine: Engine) -> SQLAlchemyOutboxStore:
    store = SQLAlchemyOutboxStore(engine=pg_engine)
    store.add_workflow_steps("root", name="chain", steps=2, now=NOW)
    return store


@pytest.fixture
def statements(pg_engine: Engine) -> Iterator[list[str]]:
    seen: list[str] = []

    def record(conn: object, cursor: object, statement: str, *_: object) -> None:
        seen.append(statement)

    event.listen(pg_engine, "before_cursor_execute", record)
    yield seen
    event.remove(pg_engine, "before_cursor_execute", record)


class Published:
    """A publish callback recording the batches it was given."""

    def __init__(self) -> None:
        self.batches: list[list[StoredMessage]] = []

    def __call__(self, messages: Sequence[StoredMessage]) -> None:
        self.batches.append(list(messages))


def leased(task_id: str | None = None) -> NewMessage:
    return dataclasses.replace(new_message(task_id=task_id), locked_until=NOW + LEASE)


def rows(store: SQLAlchemyOutboxStore) -> list[tuple[int, str]]:
    c = store.tables.outbox.c
    with store.engine.connect() as conn:
        return [(r.id, r.task_id) for r in conn.execute(select(c.id, c.task_id).order_by(c.id))]


def steps_done(store: SQLAlchemyOutboxStore) -> int:
    workflow = store.get_workflow("root")
    assert workflow is not None
    return workflow.steps_done


@pytest.mark.postgres
def test_the_row_rides_on_the_last_statement_and_is_published_after_the_commit(
    store: SQLAlchemyOutboxStore, statements: list[str]
) -> None:
    message, published = leased(), Published()
    with store.complete_once("t1", "step", now=NOW, root_id="root") as completion:
        assert store.hand_on(message, published)
        store.workflow_step_done("root", now=NOW)
        completion.result = "2"
        assert rows(store) == []  # not written yet
        assert published.batches == []

    [(row_id, task_id)] = rows(store)
    assert task_id == message.task_id
    [[sent]] = published.batches
    assert (sent.id, sent.task_id, sent.locked_until) == (row_id, message.task_id, NOW + LEASE)
    assert steps_done(store) == 1
    stored = store.completion("t1")
    assert stored is not None
    assert stored.result == "2"
    outbox = [s for s in statements if OUTBOX in s and not s.startswith("SELECT")]
    assert len(outbox) == 1  # one statement: the row, the count and the result
    assert outbox[0].startswith("WITH")
    assert "celery_outbox_completedtask" in outbox[0]
    assert "outbox_workflow" in outbox[0]


@pytest.mark.postgres
@pytest.mark.parametrize("result", [None, "2"])
def test_the_row_is_written_without_a_count(store: SQLAlchemyOutboxStore, result: str) -> None:
    message, published = leased(), Published()
    with store.complete_once("t1", "step", now=NOW) as completion:
        assert store.hand_on(message, published)
        completion.result = result

    [(row_id, _)] = rows(store)
    assert [[m.id for m in batch] for batch in published.batches] == [[row_id]]
    stored = store.completion("t1")
    assert stored is not None
    assert stored.result == result


@pytest.mark.postgres
def test_a_rolled_back_run_writes_and_publishes_nothing(store: SQLAlchemyOutboxStore) -> None:
    published = Published()

    def fail() -> None:
        with store.complete_once("t1", "step", now=NOW, root_id="root") as completion:
            assert store.hand_on(leased(), published)
            store.workflow_step_done("root", now=NOW)
            completion.result = "2"
            raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        fail()

    assert rows(store) == []
    assert published.batches == []
    assert steps_done(store) == 0
    assert store.completion("t1") is None


@pytest.mark.postgres
def test_a_pending_row_of_its_task_id_keeps_its_place(store: SQLAlchemyOutboxStore) -> None:
    first = store.add(leased("same"))
    published = Published()
    with store.complete_once("t1", "step", now=NOW, root_id="root") as completion:
        assert store.hand_on(leased("same"), published)
        store.workflow_step_done("root", now=NOW)
        completion.result = "2"

    assert rows(store) == [(first, "same")]
    assert published.batches == []  # as add() returning None: nothing to publish
    assert steps_done(store) == 1


@pytest.mark.postgres
def test_a_row_added_after_it_writes_the_held_one_first(store: SQLAlchemyOutboxStore) -> None:
    held, published = leased(), Published()
    with store.complete_once("t1", "step", now=NOW) as completion:
        assert store.hand_on(held, published)
        later = store.add(leased())
        again = store.add(leased(held.task_id))  # the held row is pending already
        completion.result = "2"

    assert again is None
    [(held_id, held_task), (later_id, _)] = rows(store)
    assert held_task == held.task_id
    assert held_id < later == later_id
    assert [[m.id for m in batch] for batch in published.batches] == [[held_id]]


@pytest.mark.postgres
def test_only_one_row_is_held(store: SQLAlchemyOutboxStore) -> None:
    with store.complete_once("t1", "step", now=NOW):
        assert store.hand_on(leased(), Published())
        assert not store.hand_on(leased(), Published())


@pytest.mark.postgres
def test_not_taken_in_a_savepoint(store: SQLAlchemyOutboxStore) -> None:
    with store.complete_once("t1", "step", now=NOW):
        session = store.current_session()
        assert isinstance(session, Session)
        with session.begin_nested():
            assert not store.hand_on(leased(), Published())


def test_not_taken_outside_a_run(engine: Engine) -> None:
    store = SQLAlchemyOutboxStore(engine=engine)
    assert not store.hand_on(leased(), Published())
    with Session(engine) as session, session.begin(), store.bind_session(session):
        assert not store.hand_on(leased(), Published())


def test_not_taken_on_sqlite(sa_sqlite_engine: Engine) -> None:
    store = SQLAlchemyOutboxStore(engine=sa_sqlite_engine)
    with store.complete_once("t1", "step", now=NOW):
        assert not store.hand_on(leased(), Published())
