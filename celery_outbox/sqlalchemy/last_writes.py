"""The last writes of an atomic run on SQLAlchemy: its result and its workflow count.

An atomic step's transaction ends with two ``UPDATE`` s that return nothing: the
``CompletedTask`` result and the ``Workflow`` step count. On PostgreSQL they are sent as
one statement (the count in a data-modifying ``WITH``), a round trip fewer per step: the
count asked for in the run's own session is held (:func:`hold_step_count`) and written
with the result, in the same transaction, after everything else the step wrote. Other
dialects run the count when it is asked for.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import (
    Connection,
    Executable,
    Table,
    Update,
    and_,
    bindparam,
    case,
    literal,
    update,
)
from sqlalchemy.orm import Session

from celery_outbox.sqlalchemy.types import UTCDateTime


@dataclass
class _Held:
    session: Session
    #: The workflow count held for the end: ``(root_id, now)``.
    step: tuple[str, datetime] | None = None


_held: ContextVar[_Held | None] = ContextVar("celery_outbox_held_writes", default=None)


@contextmanager
def holding(session: Session, dialect: str) -> Iterator[_Held | None]:
    """Within the block, a workflow count asked for in ``session`` waits for
    :func:`write_last` (PostgreSQL; ``None`` elsewhere: nothing is held)."""
    if dialect != "postgresql":
        yield None
        return
    held = _Held(session)
    token = _held.set(held)
    try:
        yield held
    finally:
        _held.reset(token)


def hold_step_count(session: Session | None, root_id: str, now: datetime) -> bool:
    """Hold one step of workflow ``root_id`` for the run's last write; ``False`` when
    there is no such run in ``session`` (the caller counts it at once)."""
    held = _held.get()
    if held is None or session is None or held.session is not session or held.step is not None:
        return False
    held.step = (root_id, now)
    return True


def write_last(
    conn: Connection,
    *,
    completed: Table,
    workflow: Table,
    held: _Held | None,
    task_id: str,
    result: str | None,
) -> None:
    """The run's result (when it has one) and its held workflow count: one statement."""
    step = held.step if held is not None else None
    if step is not None:
        count = {"root": step[0], "now": step[1]}
        if result is not None:
            values = {**count, "task": task_id, "result": result}
            conn.execute(_result_and_step(completed, workflow), values)
        else:
            conn.execute(step_done(workflow), count)
    elif result is not None:
        conn.execute(_set_result(completed), {"task": task_id, "result": result})


@functools.lru_cache(maxsize=32)
def step_done(table: Table) -> Update:
    """One more step of workflow ``:root`` done at ``:now``, never past the total;
    reaching it, a running workflow succeeds."""
    c = table.c
    reaching = and_(c.status == "running", c.steps_done + 1 >= c.steps_total)
    now = bindparam("now", type_=UTCDateTime())
    # MySQL assigns left to right, each seeing the columns set before it: steps_done last,
    # and finished_at before status, so every CASE reads the row as it was.
    return (
        update(table)
        .where(c.root_id == bindparam("root"))
        .ordered_values(
            (c.finished_at, case((reaching, now), else_=c.finished_at)),
            (c.status, case((reaching, literal("succeeded")), else_=c.status)),
            (
                c.steps_done,
                case((c.steps_done < c.steps_total, c.steps_done + 1), else_=c.steps_done),
            ),
        )
    )


@functools.lru_cache(maxsize=32)
def _set_result(table: Table) -> Update:
    """``UPDATE ... SET result = :result WHERE task_id = :task``."""
    key = table.c.task_id == bindparam("task")
    return update(table).where(key).values(result=bindparam("result"))


@functools.lru_cache(maxsize=32)
def _result_and_step(completed: Table, workflow: Table) -> Executable:
    """PostgreSQL: the result ``UPDATE`` with the step count as a data-modifying ``WITH``
    (run once, to completion, though nothing reads it)."""
    count = step_done(workflow).cte("celery_outbox_step_done")
    return _set_result(completed).add_cte(count)
