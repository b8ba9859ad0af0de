"""Every shape of Celery's canvas that can open a workflow, dispatched at the top, against
its real step count (``Workflow.steps_total``): on the in-memory store and on the
SQLAlchemy store (SQLite), over the in-memory broker with no result backend.

The expected counts are written by hand: the number of tasks the canvas runs, each
chord's body once, whatever Celery carries in its ``chain`` and ``chord`` options.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery, chain, chord, group
from celery.result import AsyncResult

from celery_outbox import OutboxTask
from celery_outbox.registry import install_store
from celery_outbox.state import reset
from celery_outbox.store.base import OutboxStore
from celery_outbox.testing import InMemoryOutboxStore


def body(*args: Any) -> None:
    """A task body."""


S = Callable[[str], Any]


def joined(s: S) -> Any:
    """A chord of two header steps and a body: three steps."""
    return chord([s("a"), s("a")], s("c"))


# fmt: off
#: (id, canvas built from ``s``, steps it runs).
SHAPES: list[tuple[str, Callable[[S], Any], int]] = [
    ("chain of two", lambda s: chain(s("a"), s("b")), 2),
    ("chain of three", lambda s: chain(s("a"), s("b"), s("c")), 3),
    ("chain in a chain", lambda s: chain(s("a"), chain(s("b"), s("c"))), 3),
    ("group", lambda s: group(s("a"), s("b")), 2),
    ("group of chains", lambda s: group(chain(s("a"), s("b")), chain(s("a"), s("b"))), 4),
    ("chord", lambda s: joined(s), 3),
    ("chord with a chain body", lambda s: chord([s("a"), s("a")], chain(s("b"), s("c"))), 4),
    ("chord with a chord body", lambda s: chord([s("a"), s("b")], joined(s)), 5),
    ("chain led by a chord", lambda s: chain(joined(s), s("d")), 4),
    ("chain led by a chord, two after", lambda s: chain(joined(s), s("c"), s("c")), 5),
    ("chain of two chords", lambda s: chain(joined(s), joined(s)), 6),
    ("chord in the middle of a chain", lambda s: chain(s("a"), joined(s), s("c")), 5),
    ("chain ending with a chord", lambda s: chain(s("a"), joined(s)), 4),
    ("chain led by a group", lambda s: chain(group(s("a"), s("b")), s("c")), 3),
    ("group in the middle of a chain", lambda s: chain(s("a"), group(s("a"), s("b")), s("c")), 4),
    ("chain led by a chord in a chain", lambda s: chain(chain(joined(s), s("d")), s("d")), 5),
    ("group holding a chord", lambda s: group(joined(s), s("a")), 4),
]
# fmt: on


@pytest.fixture(params=["memory", "sqlalchemy-sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OutboxStore]:
    if request.param == "memory":
        yield InMemoryOutboxStore()
        return
    from sqlalchemy import create_engine

    from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore, metadata

    engine = create_engine(f"sqlite:///{tmp_path / 'outbox.db'}")
    metadata.create_all(engine)
    yield SQLAlchemyOutboxStore(engine=engine)
    engine.dispose()


@pytest.fixture
def app(queue_name: str, store: OutboxStore) -> Iterator[Celery]:
    app = Celery("canvas-counts", broker="memory://", set_as_current=False)
    app.conf.update(task_default_queue=queue_name)
    for name in ("a", "b", "c", "d"):
        app.task(base=OutboxTask, name=f"wf.{name}", shared=False, atomic=True)(body)
    install_store(app, store)
    yield app
    reset(app)
    app.close()


def root_of(result: AsyncResult[Any]) -> str:
    while result.parent is not None:
        result = result.parent
    return str(result.id)


@pytest.mark.parametrize(("build", "steps"), [p[1:] for p in SHAPES], ids=[p[0] for p in SHAPES])
def test_a_canvas_at_the_top_counts_every_step_it_runs_once(
    app: Celery, store: OutboxStore, build: Callable[[S], Any], steps: int
) -> None:
    canvas = build(lambda name: app.tasks[f"wf.{name}"].s())
    result = canvas.apply_async()

    workflow = store.get_workflow(root_of(result))
    assert workflow is not None
    assert (workflow.status, workflow.steps_total, workflow.steps_done) == ("running", steps, 0)
    assert sum(store.count_workflows().values()) == 1


def test_a_chord_whose_header_holds_a_chain_is_celerys_and_needs_a_result_backend(
    app: Celery, store: OutboxStore
) -> None:
    # A header joined in the database is made of single atomic tasks (docs/workflows.md).
    s = lambda name: app.tasks[f"wf.{name}"].s()  # noqa: E731
    with pytest.raises(NotImplementedError, match="result backend"):
        chord([chain(s("a"), s("b")), s("a")], s("c")).apply_async()
    assert sum(store.count_workflows().values()) == 0
