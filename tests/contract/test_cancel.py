"""Cancelling pending rows on every store (``OutboxStore.cancel_pending``): locked, deleted
and their workflows closed ``cancelled`` with their chord joins, in one transaction."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from celery_outbox.records import MessageStatus
from tests.contract.factories import NOW, new_message, rolled_back
from tests.contract.harness import Harness
from tests.contract.test_claims import claim_due


def step(task_id: str, root_id: str, **overrides: object) -> object:
    message = new_message(task_id=task_id, **overrides)
    headers = {**(message.options.get("headers") or {}), "root_id": root_id}
    return replace(message, options={**message.options, "headers": headers})


def test_a_cancel_deletes_the_pending_rows_chosen_by_id_or_task_id(harness: Harness) -> None:
    store = harness.store
    by_id = store.add(new_message(task_id="c-1"))
    store.add(new_message(task_id="c-2", available_at=NOW + timedelta(hours=1)))  # parked
    kept = store.add(new_message(task_id="c-3"))
    assert by_id is not None
    assert kept is not None

    cancelled = store.cancel_pending(ids=[by_id, 10**12], task_ids=["c-2", "nope"], now=NOW)

    assert sorted(c.task_id for c in cancelled) == ["c-1", "c-2"]
    assert {c.task_name for c in cancelled} == {new_message().task_name}
    assert [row.task_id for row in harness.rows()] == ["c-3"]
    assert store.cancel_pending(ids=[by_id], now=NOW) == []  # gone: nothing the second time
    assert store.cancel_pending(now=NOW) == []


def test_a_failed_row_is_not_cancelled(harness: Harness) -> None:
    store = harness.store
    row_id = store.add(new_message(task_id="c-failed"))
    assert row_id is not None
    claim = claim_due(harness)
    store.record_failure(claim, [row_id], error="broker down", retry_at=None)
    assert store.cancel_pending(ids=[row_id], now=NOW) == []
    assert store.count_by_status()[MessageStatus.FAILED] == 1


def test_a_cancel_in_a_rolled_back_transaction_deletes_nothing(harness: Harness) -> None:
    store = harness.store
    store.add_workflow_steps("root-rb", name="tests.canvas", steps=2, now=NOW)
    row_id = store.add(step("c-rb", "root-rb"))
    with rolled_back(harness.transaction):
        assert len(store.cancel_pending(ids=[row_id], now=NOW)) == 1
    assert [row.id for row in harness.rows()] == [row_id]
    workflow = store.get_workflow("root-rb")
    assert workflow is not None
    assert workflow.status == "running"


def test_a_cancelled_step_closes_its_workflow_and_its_chord_joins(harness: Harness) -> None:
    store = harness.store
    store.add_workflow_steps("root-c", name="tests.chord", steps=3, now=NOW)
    store.open_join("group-c", root_id="root-c", size=2, now=NOW)
    store.join_part("group-c", 0, '"a"')
    store.add(step("header-1", "root-c", available_at=NOW + timedelta(hours=1)))
    later = NOW + timedelta(minutes=5)

    (cancelled,) = store.cancel_pending(task_ids=["header-1"], now=later)

    assert (cancelled.root_id, cancelled.leased) == ("root-c", False)
    workflow = store.get_workflow("root-c")
    assert workflow is not None
    assert (workflow.status, workflow.finished_at) == ("cancelled", later)
    assert store.join_part("group-c", 1, '"b"') is None  # the join is closed: no body
    # a cancelled workflow stays cancelled, whatever its other steps do
    store.workflow_step_done("root-c", now=later)
    store.workflow_step_done("root-c", now=later)
    store.workflow_step_done("root-c", now=later)
    store.workflow_failed("root-c", "header-0", now=later)
    store.workflow_resumed("root-c")
    assert store.get_workflow("root-c").status == "cancelled"  # type: ignore[union-attr]
    assert store.count_workflows()["cancelled"] == 1


def test_a_succeeded_workflow_is_not_reopened_by_a_cancel(harness: Harness) -> None:
    store = harness.store
    store.add_workflow_steps("root-done", name="tests.chain", steps=1, now=NOW)
    store.workflow_step_done("root-done", now=NOW)
    store.add(step("late-child", "root-done"))
    assert len(store.cancel_pending(task_ids=["late-child"], now=NOW)) == 1
    assert store.get_workflow("root-done").status == "succeeded"  # type: ignore[union-attr]
