"""The end of the soak: drain, then count what committed against what ran.

:func:`drain` keeps the workers supervised and the sweeper running, with no more
disturbances, until every committed dispatch has run (:func:`count` finds nothing
missing) or ``timeout``. When the outbox goes quiet (nothing pending, nothing queued or
unacknowledged) with something missing, the messages were lost past the broker (kombu's
``BRPOP`` reply dying with a stopped Redis, celery/kombu#305, as ``test_broker_outage.py``
shows): their published rows are made pending again, as an operator would republish
them, and counted as ``lost_past_broker``.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, func, select, update
from sqlalchemy.exc import SQLAlchemyError

from celery_outbox.sqlalchemy import completed_table, dead_letter_table, outbox_table
from celery_outbox.store.records import MessageStatus
from tests.reliability import ledger
from tests.reliability.atomic_app import ATOMIC_ADD, ATOMIC_FOLLOW, counter, effects
from tests.reliability.harness import ScenarioEnv, expected_keys, pending_rows
from tests.reliability.soak_chaos import SoakChaos
from tests.reliability.soak_load import kind_of, workflow_expected
from tests.reliability.workflow_chaos import backlog, workflows
from tests.reliability.workflow_chaos_app import COLLECT, STEP, run_table, runs
from tests.reliability.workflow_tally import WorkflowTally, tally

#: Seconds nothing may be pending or queued before the missing count as lost past the broker.
QUIET = 5.0
#: Seconds between two counts while draining (each reads the whole ledger).
COUNT_EVERY = 2.0
#: Atomic task names: their rows published and never completed may be republished.
ATOMIC_NAMES = (ATOMIC_ADD, ATOMIC_FOLLOW, STEP, COLLECT)


@dataclass(frozen=True, kw_only=True)
class SoakCount:
    """What committed against what ran, by kind."""

    committed: Counter[str]
    plain: ledger.Tally  # ``record`` and ``flaky`` (and the rolled-back ``rb*``: phantoms)
    atomic_counter: int
    atomic_effects: int  # add and follow-up effect rows
    atomic_effect_duplicates: int  # effect rows beyond one per key
    atomic_lost: int  # adds and follow-ups without their effect
    atomic_phantoms: int  # effects of rolled-back dispatches
    workflow: WorkflowTally
    workflow_steps: int
    workflows_succeeded: int
    workflows_total: int
    dead_letters: dict[str, str]  # task id: "<task name>: <exception type>"

    @property
    def tasks(self) -> int:
        """Tasks dispatched whose dispatch committed (follow-ups and steps included)."""
        return self.plain.tasks + 2 * self.committed["atomic"] + self.workflow_steps

    @property
    def lost(self) -> int:
        """Tasks that never ran."""
        workflow = self.workflow.lost + self.workflow.bodies_lost
        return len(self.plain.lost) + self.atomic_lost + workflow

    @property
    def atomic_duplicates(self) -> int:
        """Effects of atomic tasks (workflow steps included) beyond one per task: must be 0."""
        workflow = self.workflow.duplicates + self.workflow.bodies_duplicated
        return self.atomic_effect_duplicates + workflow

    @property
    def missing(self) -> bool:
        """Whether anything committed has not run yet."""
        return bool(self.lost) or self.workflows_succeeded < self.workflows_total

    def summary(self) -> str:
        """One line for assertion messages."""
        return (
            f"tasks={self.tasks} lost={self.lost} plain: {self.plain.summary()}; "
            f"atomic: counter={self.atomic_counter} effects={self.atomic_effects} "
            f"lost={self.atomic_lost} phantoms={self.atomic_phantoms}; "
            f"workflows {self.workflows_succeeded}/{self.workflows_total}: "
            f"{self.workflow.summary()}"
        )


def count(engine: Engine, env: ScenarioEnv) -> SoakCount:
    """Count the soak from the database and the ledger."""
    committed = sorted(expected_keys(engine))
    kinds = Counter(kind_of(key) for key in committed)
    plain = [key for key in committed if kind_of(key) in ("record", "flaky")]
    atomic = {key for key in committed if kind_of(key) == "atomic"}
    canvases = [key for key in committed if kind_of(key) == "workflow"]
    adds, add_keys = effects(engine, "atomic-add")
    follows, follow_keys = effects(engine, "atomic-follow")
    statuses = Counter(flow.status for flow in workflows(engine))
    expect = workflow_expected(canvases)
    return SoakCount(
        committed=kinds,
        plain=ledger.tally(plain, ledger.events(env.ledger_dir, ledger.DONE)),
        atomic_counter=counter(engine, "atomic"),
        atomic_effects=adds + follows,
        atomic_effect_duplicates=(adds - len(add_keys)) + (follows - len(follow_keys)),
        atomic_lost=len(atomic - add_keys) + len(atomic - follow_keys),
        atomic_phantoms=len((add_keys | follow_keys) - atomic),
        workflow=tally(expect, runs(engine, run_table)),
        workflow_steps=len(expect),
        workflows_succeeded=statuses["succeeded"],
        workflows_total=len(canvases),
        dead_letters=dead_letters(engine),
    )


def dead_letters(engine: Engine) -> dict[str, str]:
    """Every dead letter: none is expected (the soak's retries outlast its outages)."""
    c = dead_letter_table.c
    with engine.connect() as conn:
        rows = conn.execute(select(c.task_id, c.task_name, c.exception_type)).all()
    return {row.task_id: f"{row.task_name}: {row.exception_type}" for row in rows}


def republish_missing(engine: Engine, found: SoakCount) -> int:
    """Make the published rows of what never ran pending again (not those of dead letters:
    nothing runs them again but an operator's requeue); how many. One row per task, its
    newest: a task retried has several published rows, and a task id has at most one
    pending row.
    """
    c = outbox_table.c
    published = c.status == MessageStatus.PUBLISHED.value
    not_done = c.task_id.in_(sorted(found.plain.lost)) | (
        c.task_name.in_(ATOMIC_NAMES) & c.task_id.not_in(select(completed_table.c.task_id))
    )
    dead = c.task_id.in_(sorted(found.dead_letters))
    newest = select(func.max(c.id)).where(published & not_done & ~dead).group_by(c.task_id)
    with engine.begin() as conn:
        ids = list(conn.execute(newest).scalars())
        if ids:
            conn.execute(
                update(outbox_table)
                .where(c.id.in_(ids))
                .values(status=MessageStatus.PENDING.value, locked_until=None)
            )
    return len(ids)


@dataclass(frozen=True)
class Drained:
    """How the drain ended: messages lost past the broker (republished), a timeout."""

    lost_past_broker: int
    timed_out: bool
    seconds: float


def drain(chaos: SoakChaos, engine: Engine, env: ScenarioEnv, *, timeout: float) -> Drained:
    """Supervise until nothing committed is missing, republishing what the broker lost."""
    started = time.monotonic()
    chaos.calm()
    lost_past_broker, quiet_since, last_count = 0, time.monotonic(), 0.0
    while time.monotonic() - started < timeout:
        chaos.step(disturb=False)
        now = time.monotonic()
        if now - last_count < COUNT_EVERY:
            time.sleep(0.1)
            continue
        last_count = now
        try:
            found = count(engine, env)
            busy = pending_rows(engine) > 0 or backlog(env.broker, env.queue) > 0
        except SQLAlchemyError:
            continue
        if not found.missing:
            return Drained(lost_past_broker, False, now - started)
        if busy:
            quiet_since = now
        elif now - quiet_since >= QUIET:
            republished = republish_missing(engine, found)
            if not republished and found.dead_letters:  # nothing else can run
                return Drained(lost_past_broker, False, now - started)
            lost_past_broker += republished
            quiet_since = now
    return Drained(lost_past_broker, True, time.monotonic() - started)


def describe(found: SoakCount) -> dict[str, Any]:
    """The counts behind the soak's row of ``docs/reliability.md``."""
    return {
        "committed": dict(sorted(found.committed.items())),
        "plain_duplicates": found.plain.duplicates,
        "phantoms": len(found.plain.phantoms) + found.atomic_phantoms,
        "atomic_counter": found.atomic_counter,
        "atomic_effects": found.atomic_effects,
        "atomic_effect_duplicates": found.atomic_duplicates,
        "workflows_succeeded": f"{found.workflows_succeeded}/{found.workflows_total}",
        "workflow_wrong_values": found.workflow.wrong + found.workflow.bodies_wrong,
        "dead_letters": len(found.dead_letters),
    }
