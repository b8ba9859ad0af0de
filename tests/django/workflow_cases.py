"""The Django store's workflow rows and chord joins, run on every Django database:
PostgreSQL through pytest-django (``test_store_workflows.py``), MariaDB and SQLite through
``workflows_client``. Each case takes a fresh :class:`~tests.contract.harness.Harness`.

The cases named in :data:`CONCURRENT` run steps from threads, each in its own
transaction on its own connection: they need a database the connections share (not the
in-memory SQLite of the suite's SQLite mode; a SQLite file is fine).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta

import pytest

from celery_outbox.exceptions import StoreDataError
from celery_outbox.store.base import JoinProgress, StoredWorkflow
from django_outbox.models import ChordJoin, CompletedTask
from tests.contract.factories import NOW, new_dead_letter, new_message, rolled_back
from tests.contract.harness import Harness

#: Threads racing on one workflow or one join.
RACERS = 6
#: How long each racer holds its transaction open after writing (others wait on it).
HOLD = 0.05
#: Cases running concurrent transactions from threads.
CONCURRENT = frozenset(
    {
        "test_concurrent_additions_are_never_lost",
        "test_concurrent_header_steps_each_count_once_and_one_sees_zero",
    }
)


def later(minutes: int) -> timedelta:
    return timedelta(minutes=minutes)


def test_steps_add_up_on_one_row_that_keeps_its_name(harness: Harness) -> None:
    store = harness.store
    assert store.keeps_workflows()
    store.add_workflow_steps("root-1", name="tests.chain", steps=3, now=NOW)
    store.add_workflow_steps("root-1", name="tests.other", steps=2, now=NOW + later(1))
    assert store.get_workflow("root-1") == StoredWorkflow(
        root_id="root-1",
        name="tests.chain",
        status="running",
        steps_total=5,
        steps_done=0,
        created_at=NOW,
    )
    assert store.get_workflow("root-2") is None


def test_writes_join_the_callers_transaction(harness: Harness) -> None:
    store = harness.store
    with rolled_back(harness.transaction):
        store.add_workflow_steps("root-1", name="tests.chain", steps=2, now=NOW)
        store.open_join("group-1", root_id="root-1", size=2, now=NOW)
    assert store.get_workflow("root-1") is None
    assert not ChordJoin.objects.exists()
    with harness.transaction():
        store.add_workflow_steps("root-1", name="tests.chain", steps=2, now=NOW)
    with rolled_back(harness.transaction):
        store.workflow_step_done("root-1", now=NOW)
        store.workflow_step_done("root-1", now=NOW)
        assert store.get_workflow("root-1").status == "succeeded"
    assert store.get_workflow("root-1").steps_done == 0


def test_the_last_step_finishes_the_workflow_and_no_count_passes_the_total(
    harness: Harness,
) -> None:
    store = harness.store
    store.add_workflow_steps("root-1", name="tests.chain", steps=2, now=NOW)
    store.workflow_step_done("root-1", now=NOW + later(1))
    assert store.get_workflow("root-1") == StoredWorkflow(
        root_id="root-1",
        name="tests.chain",
        status="running",
        steps_total=2,
        steps_done=1,
        created_at=NOW,
    )
    store.workflow_step_done("root-1", now=NOW + later(2))
    done = store.get_workflow("root-1")
    assert (done.status, done.steps_done, done.finished_at) == ("succeeded", 2, NOW + later(2))
    store.workflow_step_done("root-1", now=NOW + later(3))
    assert store.get_workflow("root-1") == done
    store.workflow_step_done("root-x", now=NOW)  # no such workflow: nothing
    assert store.get_workflow("root-x") is None


def test_a_failed_workflow_resumes_keeping_its_last_failure(harness: Harness) -> None:
    store = harness.store
    store.add_workflow_steps("root-1", name="tests.chain", steps=3, now=NOW)
    store.workflow_step_done("root-1", now=NOW)
    store.workflow_failed("root-1", "task-2", now=NOW + later(1))
    failed = store.get_workflow("root-1")
    assert (failed.status, failed.failed_task_id, failed.finished_at) == (
        "failed",
        "task-2",
        NOW + later(1),
    )
    store.workflow_resumed("root-1")
    resumed = store.get_workflow("root-1")
    assert resumed == replace(failed, status="running", finished_at=None)
    store.workflow_resumed("root-1")  # running: unchanged
    assert store.get_workflow("root-1") == resumed
    store.workflow_step_done("root-1", now=NOW + later(2))
    store.workflow_step_done("root-1", now=NOW + later(3))
    assert store.get_workflow("root-1").status == "succeeded"
    store.workflow_failed("root-x", "task-9", now=NOW)  # no such workflows: nothing
    store.workflow_resumed("root-x")
    assert store.count_workflows() == {
        "running": 0,
        "succeeded": 1,
        "failed": 0,
        "cancelled": 0,
    }


def test_workflows_are_counted_by_status(harness: Harness) -> None:
    store = harness.store
    assert store.count_workflows() == {
        "running": 0,
        "succeeded": 0,
        "failed": 0,
        "cancelled": 0,
    }
    for n in range(4):
        store.add_workflow_steps(f"root-{n}", name="tests.chain", steps=1, now=NOW)
    store.workflow_step_done("root-0", now=NOW)
    store.workflow_failed("root-1", "task-1", now=NOW)
    assert store.count_workflows() == {
        "running": 2,
        "succeeded": 1,
        "failed": 1,
        "cancelled": 0,
    }


def test_a_dead_letter_fails_its_workflow_in_the_letters_transaction(harness: Harness) -> None:
    store = harness.store
    store.add_workflow_steps("root-1", name="tests.chain", steps=2, now=NOW)
    letter = new_dead_letter(failed_at=NOW + later(5))
    with rolled_back(harness.transaction):
        store.add_dead_letter(letter, workflow="root-1")
        assert store.get_workflow("root-1").status == "failed"
    assert store.get_workflow("root-1").status == "running"
    store.add_dead_letter(new_dead_letter())  # no workflow: none touched
    assert store.get_workflow("root-1").status == "running"
    store.add_dead_letter(letter, workflow="root-1")
    failed = store.get_workflow("root-1")
    assert (failed.status, failed.failed_task_id, failed.finished_at) == (
        "failed",
        letter.task_id,
        NOW + later(5),
    )


def test_a_requeue_resumes_its_workflow_only_when_it_requeues(harness: Harness) -> None:
    store = harness.store
    store.add_workflow_steps("root-1", name="tests.chain", steps=2, now=NOW)
    letter_id = store.add_dead_letter(new_dead_letter(), workflow="root-1")
    again = new_message()
    with rolled_back(harness.transaction):
        store.requeue_dead_letter(letter_id, again, by="ops", now=NOW, workflow="root-1")
        assert store.get_workflow("root-1").status == "running"
    assert store.get_workflow("root-1").status == "failed"
    task_id, row_id = store.requeue_dead_letter(
        letter_id, again, by="ops", now=NOW, workflow="root-1"
    )
    assert (task_id, row_id is not None) == (again.task_id, True)
    resumed = store.get_workflow("root-1")
    assert (resumed.status, resumed.finished_at) == ("running", None)
    store.workflow_failed("root-1", "task-3", now=NOW)
    store.requeue_dead_letter(letter_id, new_message(), by="ops", now=NOW, workflow="root-1")
    assert store.get_workflow("root-1").status == "failed"  # not dead any more: nothing


def test_an_atomic_step_stores_its_workflow(harness: Harness) -> None:
    store = harness.store
    with store.complete_once("step-1", "tests.atomic", now=NOW, root_id="root-1"):
        pass
    with store.complete_once("plain-1", "tests.atomic", now=NOW):
        pass
    found = dict(CompletedTask.objects.values_list("task_id", "root_id"))
    assert found == {"step-1": "root-1", "plain-1": None}
    assert store.completion("step-1").root_id == "root-1"
    assert store.completion("plain-1").root_id is None
    with (
        pytest.raises(StoreDataError, match="root id"),
        store.complete_once("step-2", "tests.atomic", now=NOW, root_id="r" * 256),
    ):
        pass


def test_a_join_opens_once_and_counts_each_header_step_once(harness: Harness) -> None:
    store = harness.store
    store.open_join("group-1", root_id="root-1", size=3, now=NOW)
    store.open_join("group-1", root_id="root-2", size=5, now=NOW)  # opened already: kept
    join = ChordJoin.objects.get()
    assert (join.root_id, join.size, join.remaining) == ("root-1", 3, 3)
    part = store.join_part
    assert part("group-1", 2, '"c"') == JoinProgress(remaining=2, results=[None, None, '"c"'])
    assert part("group-1", 0, None) == JoinProgress(remaining=1, results=[None, None, '"c"'])
    assert part("group-1", 0, '"x"') == JoinProgress(remaining=1, results=[None, None, '"c"'])
    assert part("group-1", 1, "<b>") == JoinProgress(remaining=0, results=[None, "<b>", '"c"'])
    for outside in (3, -1):
        with pytest.raises(IndexError):
            part("group-1", outside, "1")
    assert part("group-2", 0, "1") is None
    with pytest.raises(StoreDataError):
        store.open_join("group-3", root_id=None, size=1, now=NOW)  # type: ignore[arg-type]


def test_done_joins_are_purged_oldest_first(harness: Harness) -> None:
    store = harness.store
    for n, size in enumerate([1, 1, 2, 1]):
        store.open_join(f"group-{n}", root_id="root-1", size=size, now=NOW + later(n))
        store.join_part(f"group-{n}", 0, None)
    assert store.purge_joins(older_than=NOW + later(3), limit=1) == 1
    assert store.purge_joins(older_than=NOW + later(3), limit=10) == 1
    assert sorted(ChordJoin.objects.values_list("group_id", flat=True)) == ["group-2", "group-3"]


def race(harness: Harness, step: Callable[[int], object], count: int) -> list[object]:
    """Run ``step(n)`` for ``n`` in ``range(count)`` from threads, each in a transaction
    held open :data:`HOLD` seconds after the step; what each returned, in ``n`` order.
    """
    start = threading.Barrier(count)
    results: list[object] = [None] * count
    errors: list[BaseException] = []

    def body(n: int) -> None:
        start.wait(10)
        with harness.transaction():
            results[n] = step(n)
            time.sleep(HOLD)

    def run(n: int) -> None:
        try:
            harness.in_thread(lambda: body(n))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    return results


def test_concurrent_additions_are_never_lost(harness: Harness) -> None:
    store = harness.store

    def add(n: int) -> None:
        store.add_workflow_steps("root-c", name="tests.group", steps=n + 1, now=NOW)

    for _ in range(2):  # the first race creates the row, the second adds to it
        race(harness, add, RACERS)
    assert store.get_workflow("root-c").steps_total == 2 * sum(range(1, RACERS + 1))


def test_concurrent_header_steps_each_count_once_and_one_sees_zero(harness: Harness) -> None:
    store = harness.store
    store.open_join("group-c", root_id="root-c", size=RACERS, now=NOW)
    progress = race(harness, lambda n: store.join_part("group-c", n, f"r{n}"), RACERS)
    remaining = sorted(p.remaining for p in progress)  # type: ignore[attr-defined]
    assert remaining == list(range(RACERS))
    last = [p for p in progress if p.remaining == 0]  # type: ignore[attr-defined]
    assert last == [JoinProgress(remaining=0, results=[f"r{n}" for n in range(RACERS)])]
