"""Workflows and chord joins: ``Workflow`` rows counted in the caller's transaction, chord
joins counting header steps under a row lock, and dead letters failing (and requeues
resuming) their workflow in the letter's own transaction.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta

import pytest

from tests.contract.factories import NOW, new_dead_letter, new_message, rolled_back
from tests.contract.harness import Harness

LATER = NOW + timedelta(minutes=3)


def root() -> str:
    return f"root-{uuid.uuid4()}"


def started(h: Harness, steps: int, *, name: str = "tests.canvas") -> str:
    root_id = root()
    h.store.add_workflow_steps(root_id, name=name, steps=steps, now=NOW)
    return root_id


def progress(h: Harness, root_id: str) -> tuple[str, int, int]:
    found = h.store.get_workflow(root_id)
    assert found is not None
    return found.status, found.steps_done, found.steps_total


def test_the_store_keeps_workflows(harness: Harness) -> None:
    assert harness.store.keeps_workflows() is True


def test_a_workflow_is_created_running_then_its_steps_are_added(harness: Harness) -> None:
    root_id = started(harness, 3, name="tests.order_flow")
    harness.store.add_workflow_steps(root_id, name="tests.other", steps=2, now=LATER)

    found = harness.store.get_workflow(root_id)

    assert found is not None
    assert (found.root_id, found.name, found.status) == (root_id, "tests.order_flow", "running")
    assert (found.steps_total, found.steps_done, found.created_at) == (5, 0, NOW)
    assert (found.finished_at, found.failed_task_id) == (None, None)
    assert harness.store.get_workflow(root()) is None


def test_a_workflow_written_in_a_rolled_back_transaction_is_gone(harness: Harness) -> None:
    kept = started(harness, 2)
    with rolled_back(harness.transaction):
        gone = started(harness, 4)
        harness.store.add_workflow_steps(kept, name="tests.canvas", steps=3, now=NOW)
        harness.store.workflow_step_done(kept, now=NOW)

    assert harness.store.get_workflow(gone) is None
    assert progress(harness, kept) == ("running", 0, 2)


def test_the_step_reaching_the_total_succeeds_and_none_counts_past_it(harness: Harness) -> None:
    root_id = started(harness, 3)
    for _ in range(2):
        harness.store.workflow_step_done(root_id, now=NOW)
    assert progress(harness, root_id) == ("running", 2, 3)

    harness.store.workflow_step_done(root_id, now=LATER)
    harness.store.workflow_step_done(root_id, now=LATER + timedelta(hours=1))

    found = harness.store.get_workflow(root_id)
    assert found is not None
    assert (found.status, found.steps_done, found.finished_at) == ("succeeded", 3, LATER)


def test_changes_to_an_unknown_workflow_do_nothing(harness: Harness) -> None:
    unknown = root()
    harness.store.workflow_step_done(unknown, now=NOW)
    harness.store.workflow_failed(unknown, "task-x", now=NOW)
    harness.store.workflow_resumed(unknown)
    assert harness.store.get_workflow(unknown) is None


def test_a_failed_workflow_resumes_where_it_stopped(harness: Harness) -> None:
    root_id = started(harness, 2)
    harness.store.workflow_step_done(root_id, now=NOW)
    harness.store.workflow_failed(root_id, "task-broken", now=LATER)

    failed = harness.store.get_workflow(root_id)
    assert failed is not None
    assert (failed.status, failed.failed_task_id, failed.finished_at) == (
        "failed",
        "task-broken",
        LATER,
    )

    harness.store.workflow_resumed(root_id)
    resumed = harness.store.get_workflow(root_id)
    assert resumed is not None
    assert (resumed.status, resumed.steps_done) == ("running", 1)
    assert (resumed.finished_at, resumed.failed_task_id) == (None, "task-broken")

    harness.store.workflow_step_done(root_id, now=LATER)
    assert progress(harness, root_id) == ("succeeded", 2, 2)


def test_only_a_failed_workflow_resumes(harness: Harness) -> None:
    done = started(harness, 1)
    harness.store.workflow_step_done(done, now=LATER)
    harness.store.workflow_resumed(done)
    found = harness.store.get_workflow(done)
    assert found is not None
    assert (found.status, found.finished_at) == ("succeeded", LATER)


def test_workflows_are_counted_with_every_status(harness: Harness) -> None:
    assert harness.store.count_workflows() == {
        "running": 0,
        "succeeded": 0,
        "failed": 0,
        "cancelled": 0,
    }
    started(harness, 2)
    started(harness, 5)
    succeeded = started(harness, 1)
    harness.store.workflow_step_done(succeeded, now=NOW)
    failed = started(harness, 3)
    harness.store.workflow_failed(failed, "task-broken", now=NOW)

    assert harness.store.count_workflows() == {
        "running": 2,
        "succeeded": 1,
        "failed": 1,
        "cancelled": 0,
    }


def test_a_completed_step_keeps_its_workflow(harness: Harness) -> None:
    root_id, tid, lone = root(), f"atomic-{uuid.uuid4()}", f"atomic-{uuid.uuid4()}"
    with harness.store.complete_once(tid, "tests.step", now=NOW, root_id=root_id):
        pass
    with harness.store.complete_once(lone, "tests.step", now=NOW):
        pass
    step, alone = harness.store.completion(tid), harness.store.completion(lone)
    assert step is not None
    assert alone is not None
    assert (step.root_id, alone.root_id) == (root_id, None)


# -- chord joins -------------------------------------------------------------------------
def opened(h: Harness, size: int) -> str:
    group_id = f"group-{uuid.uuid4()}"
    h.store.open_join(group_id, root_id=root(), size=size, now=NOW)
    return group_id


def test_join_parts_are_counted_and_kept_in_header_order(harness: Harness) -> None:
    group_id = opened(harness, 3)

    second = harness.store.join_part(group_id, 2, '"c"')
    first = harness.store.join_part(group_id, 0, None)
    last = harness.store.join_part(group_id, 1, '{"b": "vé"}')

    assert second is not None
    assert first is not None
    assert last is not None
    assert (second.remaining, second.results) == (2, [None, None, '"c"'])
    assert (first.remaining, first.results) == (1, [None, None, '"c"'])
    assert (last.remaining, last.results) == (0, [None, '{"b": "vé"}', '"c"'])


def test_a_part_counted_twice_changes_nothing(harness: Harness) -> None:
    group_id = opened(harness, 2)
    harness.store.join_part(group_id, 0, None)  # a None result is in: not counted again

    again = harness.store.join_part(group_id, 0, '"other"')

    assert again is not None
    assert (again.remaining, again.results) == (1, [None, None])
    harness.store.open_join(group_id, root_id=root(), size=5, now=NOW)  # opened once only
    last = harness.store.join_part(group_id, 1, '"b"')
    assert last is not None
    assert (last.remaining, last.results) == (0, [None, '"b"'])


def test_a_join_holds_header_results_past_64_kib(harness: Harness) -> None:
    group_id, big = opened(harness, 3), '"' + "é" * 30_000 + '"'  # 60 KB in UTF-8
    for index in range(3):
        harness.store.join_part(group_id, index, big)
    final = harness.store.join_part(group_id, 0, None)
    assert final is not None
    assert final.results == [big] * 3


def test_a_part_of_a_chord_without_a_join_is_none(harness: Harness) -> None:
    assert harness.store.join_part(f"group-{uuid.uuid4()}", 0, '"a"') is None


@pytest.mark.parametrize("index", [2, -1])
def test_a_part_outside_the_header_raises_index_error(harness: Harness, index: int) -> None:
    group_id = opened(harness, 2)
    with pytest.raises(IndexError):
        harness.store.join_part(group_id, index, '"x"')
    counted = harness.store.join_part(group_id, 0, '"a"')
    assert counted is not None
    assert counted.remaining == 1


def test_a_part_counted_in_a_rolled_back_transaction_is_not_counted(harness: Harness) -> None:
    group_id = opened(harness, 2)
    with rolled_back(harness.transaction):
        harness.store.join_part(group_id, 0, '"a"')
    with rolled_back(harness.transaction):
        lost = opened(harness, 1)

    counted = harness.store.join_part(group_id, 0, '"b"')
    assert counted is not None
    assert (counted.remaining, counted.results) == (1, ['"b"', None])
    assert harness.store.join_part(lost, 0, None) is None


def test_done_joins_are_purged_in_bounded_batches(harness: Harness) -> None:
    def join(size: int, parts: int, created: timedelta) -> str:
        group_id = f"group-{uuid.uuid4()}"
        harness.store.open_join(group_id, root_id=root(), size=size, now=NOW - created)
        for index in range(parts):
            harness.store.join_part(group_id, index, None)
        return group_id

    old_done = [join(1, 1, timedelta(days=3)) for _ in range(3)]
    old_open = join(2, 1, timedelta(days=3))
    new_done = join(1, 1, timedelta(hours=1))
    cutoff = NOW - timedelta(days=1)

    assert harness.store.purge_joins(older_than=cutoff, limit=2) == 2
    assert harness.store.purge_joins(older_than=cutoff, limit=2) == 1
    assert harness.store.purge_joins(older_than=cutoff, limit=2) == 0
    assert [harness.store.join_part(g, 0, None) is None for g in old_done] == [True] * 3
    assert harness.store.join_part(old_open, 1, None) is not None
    assert harness.store.join_part(new_done, 0, None) is not None


# -- concurrency: each thread in its own transaction -------------------------------------
THREADS = 6


def in_threads(h: Harness, work: Callable[[int], None]) -> None:
    """Run ``work(i)`` in ``THREADS`` threads, each in its own transaction, together."""
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            with h.transaction():
                work(i)
                time.sleep(0.05)  # hold the transaction open: the others overlap it
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=h.in_thread, args=(lambda i=i: run(i),)) for i in range(THREADS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []


def test_concurrent_step_additions_are_never_lost(harness: Harness) -> None:
    root_id, barrier = root(), threading.Barrier(THREADS)

    def add(i: int) -> None:
        barrier.wait(10)
        harness.store.add_workflow_steps(root_id, name="tests.canvas", steps=i + 1, now=NOW)

    in_threads(harness, add)
    assert progress(harness, root_id) == ("running", 0, sum(range(1, THREADS + 1)))


def test_concurrent_steps_done_count_exactly_and_succeed_once(harness: Harness) -> None:
    root_id, barrier = started(harness, THREADS), threading.Barrier(THREADS)

    def done(i: int) -> None:
        barrier.wait(10)
        harness.store.workflow_step_done(root_id, now=NOW)

    in_threads(harness, done)
    assert progress(harness, root_id) == ("succeeded", THREADS, THREADS)


def test_concurrent_parts_each_see_the_others_committed_parts(harness: Harness) -> None:
    group_id, barrier = opened(harness, THREADS), threading.Barrier(THREADS)
    seen: dict[int, int] = {}

    def part(i: int) -> None:
        # A first read fixes a REPEATABLE READ snapshot (MariaDB's default) before any
        # part commits: only a locking read of the join sees the parts committed since.
        harness.store.get_dead_letter(10**12)
        barrier.wait(10)
        found = harness.store.join_part(group_id, i, f'"r{i}"')
        assert found is not None
        seen[i] = found.remaining

    in_threads(harness, part)
    assert sorted(seen.values()) == list(range(THREADS))  # exactly one saw 0
    final = harness.store.join_part(group_id, 0, None)
    assert final is not None
    assert (final.remaining, final.results) == (0, [f'"r{i}"' for i in range(THREADS)])


# -- dead letters and requeues ----------------------------------------------------------
def test_a_dead_letter_fails_its_workflow_in_the_same_transaction(harness: Harness) -> None:
    root_id = started(harness, 3)
    letter = new_dead_letter(failed_at=LATER)
    with rolled_back(harness.transaction):
        lost = harness.store.add_dead_letter(letter, workflow=root_id)
    assert harness.store.get_dead_letter(lost) is None
    assert progress(harness, root_id) == ("running", 0, 3)

    with harness.transaction():
        harness.store.add_dead_letter(letter, workflow=root_id)

    found = harness.store.get_workflow(root_id)
    assert found is not None
    assert (found.status, found.failed_task_id, found.finished_at) == (
        "failed",
        letter.task_id,
        LATER,
    )


def test_a_dead_letter_outside_a_workflow_changes_no_workflow(harness: Harness) -> None:
    root_id = started(harness, 1)
    harness.store.add_dead_letter(new_dead_letter())
    assert progress(harness, root_id) == ("running", 0, 1)


def test_a_requeue_resumes_the_workflow_in_the_same_transaction(harness: Harness) -> None:
    root_id = started(harness, 2)
    letter_id = harness.store.add_dead_letter(new_dead_letter(), workflow=root_id)
    with rolled_back(harness.transaction):
        harness.store.requeue_dead_letter(
            letter_id, new_message(), by="alice", now=NOW, workflow=root_id
        )
    assert progress(harness, root_id) == ("failed", 0, 2)

    with harness.transaction():
        _, row_id = harness.store.requeue_dead_letter(
            letter_id, new_message(), by="alice", now=NOW, workflow=root_id
        )

    assert row_id is not None
    assert progress(harness, root_id) == ("running", 0, 2)


def test_a_letter_not_requeued_leaves_the_workflow_failed(harness: Harness) -> None:
    root_id = started(harness, 3)
    letter_id = harness.store.add_dead_letter(new_dead_letter(), workflow=root_id)
    harness.store.requeue_dead_letter(letter_id, new_message(), by="a", now=NOW, workflow=root_id)
    harness.store.add_dead_letter(new_dead_letter(task_id="task-later"), workflow=root_id)

    _, row_id = harness.store.requeue_dead_letter(
        letter_id, new_message(), by="b", now=NOW, workflow=root_id
    )

    assert row_id is None
    found = harness.store.get_workflow(root_id)
    assert found is not None
    assert (found.status, found.failed_task_id) == ("failed", "task-later")
