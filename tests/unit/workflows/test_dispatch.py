"""Workflows at dispatch (:mod:`celery_outbox.workflows.dispatch`): Celery's own canvas of
``OutboxTask`` s, dispatched over the in-memory store and broker with no result backend.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from celery import Celery, chain, chord, group
from celery._state import _task_stack

from celery_outbox import OutboxTask
from celery_outbox.exceptions import ChordTooLarge
from celery_outbox.registry import install_store
from celery_outbox.state import reset
from celery_outbox.testing import InMemoryOutboxStore
from celery_outbox.workflows.dispatch import JOIN_HEADER, handing_on

NOW = datetime(2026, 11, 27, tzinfo=UTC)


def body(*args: Any) -> None:
    """A task body."""


@pytest.fixture
def store() -> InMemoryOutboxStore:
    return InMemoryOutboxStore()


@pytest.fixture
def app(queue_name: str, store: InMemoryOutboxStore) -> Iterator[Celery]:
    app = Celery("wf-dispatch", broker="memory://", set_as_current=False)
    app.conf.update(task_default_queue=queue_name, outbox_chord_max_header=3)
    for name in ("a", "b", "c"):
        app.task(base=OutboxTask, name=f"wf.{name}", shared=False, atomic=True)(body)
    app.task(base=OutboxTask, name="wf.loose", shared=False)(body)
    app.task(name="wf.plain", shared=False)(body)
    install_store(app, store)
    yield app
    reset(app)
    app.close()


def sig(app: Celery, name: str, *args: Any) -> Any:
    return app.tasks[f"wf.{name}"].s(*args)


def dispatch_then_roll_back(store: InMemoryOutboxStore, dispatch: Any) -> None:
    with store.atomic():
        dispatch()
        raise RuntimeError("rollback")


def headers(store: InMemoryOutboxStore) -> list[dict[str, Any]]:
    return [dict(row.options["headers"]) for row in store.rows.values()]


def test_a_chain_dispatched_in_a_transaction_opens_its_workflow_there(
    app: Celery, store: InMemoryOutboxStore
) -> None:
    with store.atomic():
        result = chain(sig(app, "a", 1), sig(app, "b"), sig(app, "loose"), sig(app, "plain"))()
    root = result.parent.parent.parent.id
    found = store.get_workflow(root)
    assert found is not None
    assert (found.status, found.steps_total, found.steps_done) == ("running", 3, 0)
    assert found.name == "a → b → loose → plain"

    rolled: list[Any] = []
    with pytest.raises(RuntimeError, match="rollback"):
        dispatch_then_roll_back(
            store, lambda: rolled.append(chain(sig(app, "a", 1), sig(app, "b"))())
        )
    assert store.get_workflow(rolled[0].parent.id) is None


def test_a_lone_task_opens_no_workflow(app: Celery, store: InMemoryOutboxStore) -> None:
    result = app.tasks["wf.a"].delay(1)
    assert store.get_workflow(result.id) is None
    assert store.count_workflows()["running"] == 0


def test_a_group_at_the_top_is_one_workflow_keyed_by_its_group_id(
    app: Celery, store: InMemoryOutboxStore
) -> None:
    with store.atomic():  # rows are looked at before they are published
        result = group(sig(app, "a", 1), chain(sig(app, "b", 2), sig(app, "c")))()
        roots = {row.options["headers"]["root_id"] for row in store.rows.values()}
    assert roots == {result.id}
    found = store.get_workflow(result.id)
    assert found is not None
    assert found.steps_total == 3


def test_a_chord_of_atomic_steps_opens_its_join_without_a_result_backend(
    app: Celery, store: InMemoryOutboxStore
) -> None:
    with store.atomic():
        result = chord([sig(app, "a", 1), sig(app, "b", 2)])(sig(app, "c"))
        marks = [h[JOIN_HEADER] for h in headers(store)]
    group_id = result.parent.id
    assert marks == [group_id, group_id]
    found = store.get_workflow(group_id)
    assert found is not None
    assert found.steps_total == 3  # two header steps and the body
    progress = store.join_part(group_id, 1, None)
    assert progress is not None
    assert progress.remaining == 1


def test_a_chord_with_a_step_that_is_not_atomic_is_celerys_and_needs_a_backend(
    app: Celery, store: InMemoryOutboxStore
) -> None:
    with pytest.raises(NotImplementedError, match="result backend"):
        chord([sig(app, "a", 1), sig(app, "loose", 2)])(sig(app, "c"))
    with pytest.raises(NotImplementedError, match="result backend"):
        chain(sig(app, "a", 1), group(sig(app, "plain"), sig(app, "b")), sig(app, "c"))()
    assert store.rows == {}


def test_a_chain_whose_group_becomes_a_joined_chord_needs_no_backend(
    app: Celery, store: InMemoryOutboxStore
) -> None:
    with store.atomic():
        chain(sig(app, "a", 1), group(sig(app, "b"), sig(app, "c")), sig(app, "a"))()
        first = [row.task_id for row in store.rows.values()]
    assert len(first) == 1  # the first step; the chord is dispatched by it
    found = store.get_workflow(first[0])
    assert found is not None
    assert found.steps_total == 4


def test_a_chord_over_the_header_limit_is_refused_before_anything_is_written(
    app: Celery, store: InMemoryOutboxStore
) -> None:
    with pytest.raises(ChordTooLarge, match=r"4 header steps.*outbox_chord_max_header=3"):
        chord([sig(app, "a", i) for i in range(4)])(sig(app, "c"))
    assert store.rows == {}
    assert sum(store.count_workflows().values()) == 0


def test_dispatches_handed_on_by_a_running_step_are_not_counted_again(
    app: Celery, store: InMemoryOutboxStore
) -> None:
    with store.atomic(), handing_on():
        result = chain(sig(app, "a", 1), sig(app, "b"))()
        assert len(store.rows) == 1  # dispatched, only not counted
    assert store.get_workflow(result.parent.id) is None


def test_a_group_at_the_top_is_counted_whole_before_its_first_member_is_written(
    app: Celery, store: InMemoryOutboxStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Outside a transaction each member is published at once: were the members counted one
    # by one, the first chain could finish the workflow before the second was counted.
    totals: list[int] = []
    add = store.add

    def add_and_look(message: Any, **kwargs: Any) -> Any:
        found = store.workflows.get(message.options["headers"]["root_id"])
        totals.append(0 if found is None else found.steps_total)
        return add(message, **kwargs)

    monkeypatch.setattr(store, "add", add_and_look)
    group(chain(sig(app, "a", 1), sig(app, "b")), chain(sig(app, "a", 2), sig(app, "b")))()
    assert totals == [4, 4]


def test_tasks_started_by_tasks_outside_any_workflow_open_none(
    app: Celery, store: InMemoryOutboxStore, queue_name: str
) -> None:
    # push -> (its dead letter's receiver) sms -> messenger: plain fail-over, no canvas
    from tests.unit.worker.support import deliver

    def start(child: str) -> Any:
        def run(*args: Any) -> None:
            app.tasks[child].delay(1)

        return run

    sms = app.task(base=OutboxTask, name="wf.sms", shared=False)(start("wf.loose"))
    _task_stack.push(sms)  # as the worker's tracer does: it is the current worker task
    try:
        deliver(sms, 1, task_id="sms-1", queue=queue_name, root_id="push-1")
        assert sum(store.count_workflows().values()) == 0

        # a task started by a step of a real workflow joins it
        store.add_workflow_steps("wf-1", name="chain", steps=2, now=NOW)
        deliver(sms, 1, task_id="s-1", queue=queue_name, root_id="wf-1")
    finally:
        _task_stack.pop()
    found = store.get_workflow("wf-1")
    assert found is not None
    assert (found.steps_total, found.steps_done) == (3, 1)


@pytest.mark.parametrize("shape", ["chord", "group"])
def test_a_canvas_whose_tasks_are_a_generator_is_left_to_celery_to_draw(
    app: Celery, store: InMemoryOutboxStore, monkeypatch: pytest.MonkeyPatch, shape: str
) -> None:
    # Celery dispatches a generator's tasks as it draws them (celery#3021): counting the
    # canvas up front, or joining it in the database, would draw it all first.
    app.conf.result_backend = "cache+memory://"
    drawn: list[int] = []
    written: list[int] = []
    add = store.add

    def add_and_note(message: Any, **kwargs: Any) -> Any:
        written.append(len(drawn))
        return add(message, **kwargs)

    def members() -> Iterator[Any]:
        for n in range(4):
            drawn.append(n)
            yield sig(app, "a", n)

    monkeypatch.setattr(store, "add", add_and_note)
    if shape == "chord":
        chord(members())(sig(app, "c"))
    else:
        group(members())()

    assert len(written) == 4
    if shape == "group":  # Celery draws a chord's header whole unless its backend is Redis's
        assert written[0] < 4, f"the generator was drawn to its end first: {written}"
    assert sum(store.count_workflows().values()) == 0
    assert all(JOIN_HEADER not in h for h in headers(store))
