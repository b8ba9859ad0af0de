"""Durable workflows end to end: Celery's chain, group and chord of atomic ``OutboxTask`` s
on the SQLAlchemy store (real PostgreSQL), a real worker and Redis, with no result
backend (and once with one): every step's effect once, chord bodies once with the
header's results in order, ``Workflow`` rows counted in the steps' transactions, a
dead-lettered step failing its workflow and its requeue resuming it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery, chain, chord, group
from celery.result import AsyncResult
from sqlalchemy import Engine, insert, select
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from celery_outbox import cancel, requeue
from celery_outbox.clock import utcnow
from celery_outbox.exceptions import ChordTooLarge, DeadLetterCompleted
from celery_outbox.relay.relay import relay_for
from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore, dead_letter_table, outbox_table
from celery_outbox.store.base import StoredWorkflow
from celery_outbox.store.records import DeadLetterStatus, NewDeadLetter
from tests import services
from tests.brokers import purge_queue
from tests.integration.workflow_app import (
    ADD,
    COLLECT,
    FAILS_UNTIL,
    LOOSE,
    create_app,
    effects,
    passes,
    skipped,
)
from tests.worker import SharedWorker, wait_for

APP_MODULE = "tests.integration.workflow_app"

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


@dataclass
class World:
    app: Celery
    engine: Engine
    store: SQLAlchemyOutboxStore

    def s(self, name: str, *args: Any) -> Any:
        return self.app.tasks[name].s(*args)

    def effect(self, key: str) -> Any:
        with self.engine.connect() as conn:
            value = conn.execute(select(effects.c.value).where(effects.c.key == key)).scalar()
        return None if value is None else json.loads(value)

    def effect_keys(self, prefix: str) -> list[str]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(effects.c.key).where(effects.c.key.like(f"{prefix}%")))
            return sorted(row.key for row in rows)

    def workflow(self, root_id: str) -> StoredWorkflow | None:
        return self.store.get_workflow(root_id)

    def finished(self, root_id: str, *, timeout: float = 30) -> StoredWorkflow:
        def done() -> bool:
            found = self.workflow(root_id)
            return found is not None and found.status != "running"

        wait_for(done, timeout=timeout, what=f"workflow {root_id} to finish")
        found = self.workflow(root_id)
        assert found is not None
        return found


@pytest.fixture(scope="module")
def database_url(postgres_url: str) -> Iterator[str]:
    name = services.unique_name("outbox_wf_")
    services.create_postgres_database(postgres_url, name)
    url = make_url(services.with_db_name(postgres_url, name)).set(drivername="postgresql+psycopg")
    yield url.render_as_string(hide_password=False)
    services.drop_postgres_database(postgres_url, name)


@pytest.fixture(scope="module")
def queue(redis_url: str) -> Iterator[str]:
    from tests.brokers import delete_queue, new_queue_name

    name = new_queue_name()
    yield name
    delete_queue(redis_url, name)


def _world(
    redis_url: str, queue: str, database_url: str, shared_worker: SharedWorker, backend: str | None
) -> Iterator[World]:
    purge_queue(redis_url, queue)
    app, engine, store = create_app(redis_url, queue, database_url, backend)
    env = {
        "OUTBOX_TEST_BROKER": redis_url,
        "OUTBOX_TEST_QUEUE": queue,
        "OUTBOX_TEST_DATABASE": database_url,
        "OUTBOX_TEST_BACKEND": backend or "",
    }
    shared_worker.get(APP_MODULE, queue=queue, env=env)
    yield World(app, engine, store)
    relay_for(app).close()
    app.close()
    engine.dispose()


@pytest.fixture
def world(
    redis_url: str, queue: str, database_url: str, shared_worker: SharedWorker
) -> Iterator[World]:
    yield from _world(redis_url, queue, database_url, shared_worker, None)


def _root(result: AsyncResult[Any]) -> str:
    while result.parent is not None:
        result = result.parent
    return str(result.id)


def test_a_chain_runs_each_step_once_and_its_workflow_succeeds(world: World) -> None:
    result = chain(
        world.s(ADD, 1, 1, "chain-1"), world.s(ADD, 10, "chain-2"), world.s(ADD, 100, "chain-3")
    ).apply_async()

    found = world.finished(_root(result))
    assert (found.status, found.steps_done, found.steps_total) == ("succeeded", 3, 3)
    assert found.name == "add → add → add"
    assert world.effect_keys("chain-") == ["chain-1", "chain-2", "chain-3"]
    assert world.effect("chain-3") == 112


def test_a_chord_joins_in_the_database_without_a_result_backend(world: World) -> None:
    header = [world.s(ADD, i, i, f"chord-h{i}") for i in range(6)]
    result = chord(header)(world.s(COLLECT, "chord-body"))

    root = str(result.parent.id)  # a chord at the top: its group id
    found = world.finished(root)
    assert (found.status, found.steps_done, found.steps_total) == ("succeeded", 7, 7)
    assert world.effect("chord-body") == [0, 2, 4, 6, 8, 10]  # header order, once


def test_a_chord_inside_a_chain_and_a_chain_led_by_a_group(world: World) -> None:
    inner = chord([world.s(ADD, 1, f"nest-h{i}") for i in range(3)], world.s(COLLECT, "nest-b"))
    result = chain(world.s(ADD, 1, 1, "nest-a"), inner, world.s(LOOSE, "nest-z")).apply_async()
    found = world.finished(_root(result))
    assert (found.status, found.steps_done, found.steps_total) == ("succeeded", 6, 6)
    assert world.effect("nest-b") == [3, 3, 3]
    assert world.effect("nest-z") == [3, 3, 3]

    # chain(a, group(b, c), d): Celery makes the group and d a chord
    led = chain(
        world.s(ADD, 2, 2, "led-a"),
        group(world.s(ADD, 1, "led-b"), world.s(ADD, 2, "led-c")),
        world.s(COLLECT, "led-d"),
    ).apply_async()
    found = world.finished(_root(led))
    assert (found.status, found.steps_done, found.steps_total) == ("succeeded", 4, 4)
    assert world.effect("led-d") == [5, 6]


def test_chains_led_by_a_chord_finish_with_every_step_counted_once(world: World) -> None:
    # chain(chord, d) used to count d twice (steps_total 5 for 4 steps): `running` forever.
    led = chain(
        chord([world.s(ADD, i, i, f"clc-h{i}") for i in range(2)], world.s(COLLECT, "clc-b")),
        world.s(COLLECT, "clc-d"),
    ).apply_async()
    twice = chain(
        chord([world.s(ADD, i, 1, f"cc2-h{i}") for i in range(2)], world.s(COLLECT, "cc2-b")),
        chord(
            [world.app.tasks[ADD].si(i, 2, f"cc2-k{i}") for i in range(2)],
            world.s(COLLECT, "cc2-c"),
        ),
    ).apply_async()

    found = world.finished(_root(led))
    assert (found.status, found.steps_done, found.steps_total) == ("succeeded", 4, 4)
    assert world.effect("clc-b") == [0, 2]
    assert world.effect("clc-d") == [0, 2]
    found = world.finished(_root(twice))
    assert (found.status, found.steps_done, found.steps_total) == ("succeeded", 6, 6)
    assert world.effect("cc2-c") == [2, 3]


def test_a_group_of_chains_is_one_workflow_keyed_by_the_group_id(world: World) -> None:
    result = group(
        chain(world.s(ADD, 1, 1, "goc-1a"), world.s(ADD, 1, "goc-1b")),
        chain(world.s(ADD, 2, 2, "goc-2a"), world.s(ADD, 2, "goc-2b")),
    ).apply_async()

    found = world.finished(str(result.id))
    assert (found.status, found.steps_done, found.steps_total) == ("succeeded", 4, 4)
    assert world.effect_keys("goc-") == ["goc-1a", "goc-1b", "goc-2a", "goc-2b"]


def test_a_dead_lettered_step_fails_its_workflow_and_its_requeue_resumes_it(
    world: World,
) -> None:
    result = chain(
        world.s(ADD, 1, 1, "dl-a"), world.s(FAILS_UNTIL, "dl-b"), world.s(ADD, 5, "dl-c")
    ).apply_async()
    root = _root(result)
    found = world.finished(root)
    assert found.status == "failed"
    assert found.steps_done == 1
    with world.engine.connect() as conn:
        letter = conn.execute(
            select(dead_letter_table.c.id, dead_letter_table.c.task_id).where(
                dead_letter_table.c.task_id == found.failed_task_id
            )
        ).one()

    with world.engine.begin() as conn:
        conn.execute(insert(passes).values(key="dl-b"))
    requeue(world.app, letter.id)
    resumed = world.workflow(root)
    assert resumed is not None
    assert resumed.status == "running"

    found = world.finished(root)
    assert (found.status, found.steps_done, found.steps_total) == ("succeeded", 3, 3)
    assert world.effect("dl-c") == 7


def test_a_dead_letter_whose_step_then_completes_is_completed_and_counted(world: World) -> None:
    # A redelivery past outbox_max_deliveries dead-letters a step without running it while
    # an earlier delivery is still on its way; that delivery then commits. Written here in
    # the dispatching transaction, before any delivery runs: the same order of events.
    with Session(world.engine) as session, world.store.bind_session(session):
        result = chain(world.s(ADD, 1, 1, "sd-a"), world.s(ADD, 2, "sd-b")).apply_async()
        root = _root(result)
        letter_id = world.store.add_dead_letter(
            NewDeadLetter(
                task_id=result.id,
                task_name=ADD,
                args=[2, "sd-b"],
                kwargs={},
                options={"root_id": root},
                exception_type="celery_outbox.exceptions.TooManyDeliveries",
                exception_message="delivered 6 times without finishing",
                traceback="",
                retries=0,
                first_failed_at=utcnow(),
                failed_at=utcnow(),
            ),
            workflow=root,
        )
        session.commit()

    wait_for(lambda: world.effect("sd-b") is not None, timeout=30, what="the step to run")
    letter = world.store.get_dead_letter(letter_id)
    assert letter is not None
    assert letter.status is DeadLetterStatus.COMPLETED  # never requeued by mistake
    with pytest.raises(DeadLetterCompleted, match="completed after the letter was written"):
        requeue(world.app, letter_id)
    found = world.workflow(root)
    assert found is not None
    assert (found.status, found.steps_done, found.steps_total) == ("succeeded", 2, 2)


def test_a_dead_lettered_chord_header_step_resumes_the_join(world: World) -> None:
    header = [world.s(ADD, 1, 1, "dlc-h0"), world.s(FAILS_UNTIL, 5, "dlc-h1")]
    result = chord(header)(world.s(COLLECT, "dlc-body"))
    root = str(result.parent.id)
    assert world.finished(root).status == "failed"
    with world.engine.connect() as conn:
        letter_id = conn.execute(
            select(dead_letter_table.c.id)
            .where(dead_letter_table.c.task_name == FAILS_UNTIL)
            .order_by(dead_letter_table.c.id.desc())
        ).scalar()
    with world.engine.begin() as conn:
        conn.execute(insert(passes).values(key="dlc-h1"))
    requeue(world.app, letter_id)

    found = world.finished(root)
    assert found.status == "succeeded"
    assert world.effect("dlc-body") == [2, 5]


def test_cancelling_a_parked_header_step_cancels_the_workflow_and_closes_its_chord(
    world: World,
) -> None:
    parked = world.app.tasks[ADD].s(2, 2, "cx-h1").set(countdown=3600)
    result = chord([world.s(ADD, 1, 1, "cx-h0"), parked])(world.s(COLLECT, "cx-body"))
    root = str(result.parent.id)
    parked_id = result.parent.results[1].id
    wait_for(lambda: world.effect("cx-h0") is not None, timeout=30, what="the header step")

    done = cancel(world.app, task_ids=[parked_id], by="ops")

    assert list(done.cancelled.values()) == [parked_id]
    assert (done.in_flight, done.skipped, done.revoked, done.revoke_error) == ((), 0, True, "")
    found = world.workflow(root)
    assert found is not None
    assert (found.status, found.steps_done, found.steps_total) == ("cancelled", 1, 3)
    assert found.finished_at is not None
    assert world.store.join_part(root, 1, None) is None  # closed: its body can never run
    assert world.effect("cx-body") is None


def test_a_header_step_running_after_its_chord_was_cancelled_completes_without_the_body(
    world: World,
) -> None:
    # One header step waits 5 s on the worker (a broker ETA), the other is parked for an
    # hour and cancelled (by task id, as an operator would) before the first runs.
    header = [
        world.s(ADD, 1, 1, "cancel-h0").set(countdown=5),
        world.s(ADD, 2, 2, "cancel-h1").set(countdown=3600),
    ]
    result = chord(header)(world.s(COLLECT, "cancel-body"))
    root = str(result.parent.id)
    with world.engine.connect() as conn:
        parked = conn.execute(
            select(outbox_table.c.task_id).where(
                outbox_table.c.available_at > utcnow() + timedelta(minutes=30)
            )
        ).scalar_one()

    cancelled = cancel(world.app, task_ids=[parked], by="ops")

    assert (list(cancelled.cancelled.values()), cancelled.revoked) == ([parked], True)
    closed = world.workflow(root)
    assert closed is not None
    assert (closed.status, closed.steps_done, closed.steps_total) == ("cancelled", 0, 3)
    assert world.effect("cancel-h0") is None  # the cancel came first
    assert world.store.join_part(root, 1, None) is None  # the chord is closed
    # The other header step still runs and is counted in its own transaction; the body
    # is never dispatched, and no dead letter says the join was missing.
    wait_for(lambda: world.effect("cancel-h0") == 2, timeout=30, what="the other header step")
    time.sleep(1.0)  # a body dispatched by that step would run now
    done = world.workflow(root)
    assert done is not None
    assert (done.status, done.steps_done, done.finished_at) == ("cancelled", 1, closed.finished_at)
    assert world.effect("cancel-body") is None
    steps = [str(r.id) for r in result.parent.results]
    with world.engine.connect() as conn:
        letters = dead_letter_table.c.task_id.in_(steps)
        assert conn.execute(select(dead_letter_table.c.id).where(letters)).all() == []


def test_a_rolled_back_canvas_leaves_no_workflow_and_no_step(world: World) -> None:
    with Session(world.engine) as session, world.store.bind_session(session):
        result = chord([world.s(ADD, 1, 1, "rb-h")])(world.s(COLLECT, "rb-body"))
        session.rollback()
    assert world.workflow(str(result.parent.id)) is None
    assert world.store.join_part(str(result.parent.id), 0, None) is None


def test_a_chord_over_the_header_limit_is_refused_at_dispatch(world: World) -> None:
    header = [world.s(ADD, i, i, f"big-{i}") for i in range(51)]
    with pytest.raises(ChordTooLarge, match=r"51 header steps.*outbox_chord_max_header=50"):
        chord(header)(world.s(COLLECT, "big-body"))


@pytest.fixture
def backed_world(
    redis_url: str, queue: str, database_url: str, shared_worker: SharedWorker
) -> Iterator[World]:
    yield from _world(redis_url, queue, database_url, shared_worker, redis_url)


def test_with_a_result_backend_the_join_is_still_the_databases_and_results_arrive(
    backed_world: World,
) -> None:
    world = backed_world
    header = [world.s(ADD, i, 1, f"rbk-h{i}") for i in range(4)]
    result = chord(header)(world.s(COLLECT, "rbk-body"))

    assert result.get(timeout=30) == [1, 2, 3, 4]
    found = world.finished(str(result.parent.id))
    assert (found.status, found.steps_done, found.steps_total) == ("succeeded", 5, 5)
    assert world.effect("rbk-body") == [1, 2, 3, 4]
    # the backend's own chord join never ran: it would have sent the body again (skipped);
    # a task sent now runs after anything already queued (one solo worker)
    world.app.tasks[LOOSE].delay(0, "rbk-after")
    wait_for(lambda: world.effect("rbk-after") == 0, timeout=30, what="the task sent after")
    with world.engine.connect() as conn:
        assert conn.execute(select(skipped.c.task_id)).scalars().all() == []
