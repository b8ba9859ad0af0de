"""An atomic run's last writes on SQLAlchemy: its result and its workflow count.

The count asked for in the run's own session is written with the result when the run
ends (on PostgreSQL in the same statement), in its transaction: both commit, or neither.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("sqlalchemy")

from sqlalchemy import Engine, event

from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore
from tests.contract.factories import NOW


@pytest.fixture
def store(engine: Engine) -> SQLAlchemyOutboxStore:
    store = SQLAlchemyOutboxStore(engine=engine)
    store.add_workflow_steps("root", name="chain", steps=2, now=NOW)
    return store


@pytest.fixture
def statements(engine: Engine) -> Iterator[list[str]]:
    seen: list[str] = []

    def record(conn: object, cursor: object, statement: str, *_: object) -> None:
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    yield seen
    event.remove(engine, "before_cursor_execute", record)


def done(store: SQLAlchemyOutboxStore) -> int:
    workflow = store.get_workflow("root")
    assert workflow is not None
    return workflow.steps_done


def writing(statements: list[str], table: str) -> list[str]:
    return [
        s for s in statements if s.lstrip().upper().startswith(("UPDATE", "WITH")) and table in s
    ]


def test_the_count_of_a_run_commits_with_its_result(
    store: SQLAlchemyOutboxStore, engine: Engine, statements: list[str]
) -> None:
    with store.complete_once("t1", "step", now=NOW, root_id="root") as completion:
        store.workflow_step_done("root", now=NOW)
        completion.result = "2"

    assert done(store) == 1
    stored = store.completion("t1")
    assert stored is not None
    assert stored.result == "2"
    counts = writing(statements, "outbox_workflow")
    assert len(counts) == 1
    if engine.dialect.name == "postgresql":  # one statement: the count rides on the result
        assert "celery_outbox_completedtask" in counts[0]
        assert writing(statements, "celery_outbox_completedtask") == counts


def test_a_run_without_a_result_still_counts(store: SQLAlchemyOutboxStore) -> None:
    with store.complete_once("t1", "step", now=NOW, root_id="root"):
        store.workflow_step_done("root", now=NOW)

    assert done(store) == 1


def test_a_rolled_back_run_counts_nothing(store: SQLAlchemyOutboxStore) -> None:
    def fail() -> None:
        with store.complete_once("t1", "step", now=NOW, root_id="root") as completion:
            store.workflow_step_done("root", now=NOW)
            completion.result = "2"
            raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        fail()

    assert done(store) == 0
    assert store.completion("t1") is None


def test_the_last_step_succeeds_the_workflow(store: SQLAlchemyOutboxStore) -> None:
    for task_id in ("t1", "t2"):
        with store.complete_once(task_id, "step", now=NOW, root_id="root") as completion:
            store.workflow_step_done("root", now=NOW)
            completion.result = "1"

    workflow = store.get_workflow("root")
    assert workflow is not None
    assert (workflow.steps_done, workflow.status, workflow.finished_at) == (2, "succeeded", NOW)


def test_a_count_outside_a_run_is_written_at_once(store: SQLAlchemyOutboxStore) -> None:
    store.workflow_step_done("root", now=NOW)

    assert done(store) == 1
