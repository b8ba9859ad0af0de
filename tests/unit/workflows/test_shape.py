"""What a canvas looks like from one dispatch (:mod:`celery_outbox.workflows.shape`): pure
functions over Celery's own signatures, built with Celery's canvas (nothing sent).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, chain, chord, group

from celery_outbox.workflows.shape import (
    NAME_LIMIT,
    canvas_options,
    count_steps,
    describe,
    dispatch_steps,
    handed_on_ids,
    in_canvas,
    workflow_root,
)


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("shape", broker="memory://", set_as_current=False)
    for name in ("a", "b", "c", "plain"):
        app.task(name=f"shape.{name}", shared=False)(noop)
    yield app
    app.close()


def noop(*args: Any) -> None:
    """A task body."""


def is_step(name: str) -> bool:
    return name != "shape.plain"


def s(app: Celery, name: str) -> Any:
    return app.tasks[f"shape.{name}"].s()


def test_a_lone_task_is_no_canvas_step_but_a_chain_group_chord_or_child_is() -> None:
    assert not in_canvas("t1", {})
    assert not in_canvas("t1", {"root_id": "t1"})
    assert in_canvas("t1", {"root_id": "r"})  # a task another task started
    assert in_canvas("t1", {"chain": [{"task": "x"}]})
    assert in_canvas("t1", {"group_id": "g"})
    assert in_canvas("t1", {"chord": {"task": "body"}})
    assert workflow_root("t1", {}) is None
    assert workflow_root("t1", {"chain": [{"task": "x"}]}) == "t1"
    assert workflow_root("t1", {"root_id": "r", "group_id": "g"}) == "r"


def test_steps_are_counted_through_every_kind_of_canvas(app: Celery) -> None:
    assert count_steps(s(app, "a"), is_step) == 1
    assert count_steps(s(app, "plain"), is_step) == 0  # not an outbox task: never reports
    assert count_steps(chain(s(app, "a"), s(app, "b"), s(app, "plain")), is_step) == 2
    assert count_steps(group(s(app, "a"), chain(s(app, "b"), s(app, "c"))), is_step) == 3
    five = chord([s(app, "a") for _ in range(5)], s(app, "b"))
    assert count_steps(five, is_step) == 6  # DESIGN: a chord of 5 and its body is 6
    nested = chain(s(app, "a"), chord([s(app, "b"), s(app, "c")], chain(s(app, "a"), s(app, "b"))))
    assert count_steps(nested, is_step) == 5
    assert count_steps(None, is_step) == 0


def test_a_dispatch_counts_itself_its_chain_and_once_its_chords_body(app: Celery) -> None:
    rest = [s(app, "c"), chord([s(app, "a"), s(app, "b")], s(app, "c"))]  # reversed, as Celery
    assert dispatch_steps("shape.a", {"chain": rest}, is_step) == 5
    body = s(app, "c")
    assert dispatch_steps("shape.a", {"chord": body, "group_index": 0}, is_step) == 2
    assert dispatch_steps("shape.a", {"chord": body, "group_index": 3}, is_step) == 1
    assert dispatch_steps("shape.plain", {}, is_step) == 0


def test_the_ids_a_step_hands_on_are_its_chain_and_chord_body_not_its_callbacks(
    app: Celery,
) -> None:
    nxt = s(app, "b")
    nxt.freeze("next")
    inner = chord([s(app, "a"), s(app, "c")], s(app, "b"))
    inner.freeze("inner-body")
    callback = s(app, "c")
    callback.freeze("callback")
    nxt.link(callback)
    ids = handed_on_ids({"chain": [dict(inner), dict(nxt)], "chord": None})
    assert {"next", "inner-body"} <= ids
    header = getattr(inner.tasks, "tasks", inner.tasks)
    assert {task["options"]["task_id"] for task in header} <= ids
    assert "callback" not in ids
    assert handed_on_ids({"chain": None, "chord": dict(nxt)}) >= {"next"}


def test_a_workflow_is_named_by_its_tasks_and_the_name_is_bounded(app: Celery) -> None:
    rest = [chord([s(app, "a"), s(app, "b")], s(app, "c")), group(s(app, "a"), s(app, "b"))]
    assert describe("shape.a", {"chain": rest}) == "a → group(ax2) → chord(ax2) → c"
    assert describe("shape.a", {"chord": dict(s(app, "c"))}) == "chord(a…) → c"
    long = describe("shape.a", {"chain": [s(app, "b")] * 200})
    assert len(long) == NAME_LIMIT
    assert long.endswith("…")


def test_canvas_options_keep_what_a_requeue_needs_and_nothing_outside_a_canvas() -> None:
    options = {
        "root_id": "r",
        "parent_id": "p",
        "group_id": None,
        "chain": [{"task": "x"}],
        "link": [{"task": "cb"}],
        "queue": "q",
        "headers": {"outbox_join": "g", "other": 1},
    }
    kept = canvas_options(options, headers=("outbox_join",))
    assert kept == {
        "root_id": "r",
        "parent_id": "p",
        "chain": [{"task": "x"}],
        "link": [{"task": "cb"}],
        "headers": {"outbox_join": "g"},
    }
    assert canvas_options({"queue": "q"}) == {}
