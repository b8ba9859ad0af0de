"""Cancelling pending rows on every store (``OutboxStore.cancel_pending``): locked, deleted
and their workflows closed ``cancelled`` with their chord joins, in one transaction.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery

from celery_outbox import cancel, install_store
from celery_outbox.store.records import Claim, MessageStatus, StoredMessage
from tests.contract.factories import LEASE, NOW, new_message, rolled_back, written
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


# -- round 3 review: what the cancel above left open -----------------------------------------
LATER = NOW + timedelta(minutes=5)


@pytest.fixture
def app(harness: Harness, memory_broker_url: str) -> Iterator[Celery]:
    """A Celery app on ``harness``'s store and the in-memory broker (the revoke's)."""
    made = Celery("contract-cancel", broker=memory_broker_url, set_as_current=False)
    install_store(made, harness.store)
    yield made
    made.close()


def test_a_row_dispatched_and_cancelled_in_one_transaction_is_never_published(
    harness: Harness,
) -> None:
    leased: list[set[int]] = []

    def publish(messages: Sequence[StoredMessage]) -> None:
        leased.append(harness.store.still_leased(messages))

    with harness.transaction():
        message = replace(new_message(task_id="c-same-tx"), locked_until=NOW + LEASE)
        row_id = harness.store.add(message)
        harness.store.defer_publish(written(row_id, message), publish)
        assert [c.id for c in harness.store.cancel_pending(ids=[row_id], now=NOW)] == [row_id]

    assert leased == [set()]  # the on-commit publisher finds its row gone: nothing sent
    assert harness.rows() == []


def test_a_second_cancel_leaves_a_cancelled_workflow_as_it_was_closed(harness: Harness) -> None:
    store = harness.store
    store.add_workflow_steps("root-twice", name="tests.group", steps=3, now=NOW)
    store.workflow_failed("root-twice", "task-broken", now=NOW)
    first, second = store.add(step("tw-1", "root-twice")), store.add(step("tw-2", "root-twice"))
    assert first is not None
    assert second is not None

    store.cancel_pending(ids=[first], now=LATER)
    store.open_join("group-late", root_id="root-twice", size=2, now=LATER)  # a late chord
    store.cancel_pending(ids=[second], now=LATER + timedelta(hours=1))

    workflow = store.get_workflow("root-twice")
    assert workflow is not None
    assert (workflow.status, workflow.finished_at, workflow.failed_task_id) == (
        "cancelled",
        LATER,
        "task-broken",
    )
    assert store.join_part("group-late", 0, None) is not None  # not the cancel's to close


def test_the_first_step_of_a_chain_closes_the_workflow_it_roots(harness: Harness) -> None:
    store = harness.store  # a chain's first task: its own id is the root, no root_id header
    store.add_workflow_steps("c-first", name="tests.chain", steps=3, now=NOW)
    store.add(new_message(task_id="c-first"))

    (cancelled,) = store.cancel_pending(task_ids=["c-first"], now=LATER)

    assert cancelled.root_id == "c-first"
    assert store.get_workflow("c-first").status == "cancelled"  # type: ignore[union-attr]


def test_a_claim_during_an_open_cancel_never_takes_its_rows(harness: Harness) -> None:
    row_id = harness.store.add(new_message(task_id="c-race"))
    assert row_id is not None
    claims: list[Claim] = []
    with harness.transaction():
        harness.store.cancel_pending(ids=[row_id], now=NOW)
        claimer = threading.Thread(
            target=harness.in_thread, args=(lambda: claims.append(claim_due(harness)),)
        )
        claimer.start()
        time.sleep(0.2)  # the claim skips the locked row, or waits for the commit
    claimer.join(timeout=30)

    assert [c.messages for c in claims] == [()]
    assert harness.rows() == []


def test_in_a_transaction_the_result_tells_the_revoke_once_it_committed(
    harness: Harness, app: Celery
) -> None:
    row_id = harness.store.add(new_message(task_id="c-tx"))
    with harness.transaction():
        done = cancel(app, ids=[row_id], by="ops")
        assert (done.cancelled, done.revoked) == ({row_id: "c-tx"}, False)

    assert (done.revoked, done.revoke_error) == (True, "")


@pytest.mark.parametrize(
    ("chosen", "error", "message"),
    [
        ({"ids": "12"}, TypeError, "ids='12' is a string: give a list of them"),
        ({"task_ids": "c-keep"}, TypeError, "task_ids='c-keep' is a string: give a list"),
        ({"ids": [0]}, ValueError, "row id 0 is not accepted: give a positive integer"),
        ({"ids": [True]}, ValueError, "row id True is not accepted"),
        ({"ids": ["1"]}, ValueError, "row id '1' is not accepted"),
        ({"task_ids": [""]}, ValueError, "task id '' is not accepted: give a string of 1 to"),
        ({"task_ids": ["t" * 256]}, ValueError, "is not accepted: give a string of 1 to 255"),
    ],
)
def test_a_bad_choice_is_refused_naming_it_and_cancels_nothing(
    harness: Harness, app: Celery, chosen: dict[str, Any], error: type[Exception], message: str
) -> None:
    kept = [harness.store.add(new_message(task_id=f"c-keep-{n}")) for n in range(3)]
    with pytest.raises(error, match=message):
        cancel(app, **chosen)
    assert sorted(r.id for r in harness.rows()) == sorted(kept)
