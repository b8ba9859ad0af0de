"""``add(..., supersedes=...)``: a dispatch taking the place of the pending row of its id.

The rule (:mod:`celery_outbox.store.superseding`) is the core's; every store must carry it out
the same way: offer the pending row, and only when it is accepted delete it (still
pending) and insert the new row, in the caller's transaction.
"""

from __future__ import annotations

from celery_outbox.store.records import MessageStatus, StoredMessage
from tests.contract.factories import FAR_FUTURE, LEASE, NOW, new_message, rolled_back
from tests.contract.harness import Harness


def pending_rows(h: Harness) -> list[StoredMessage]:
    claim = h.store.claim_due(
        now=NOW, created_before=FAR_FUTURE, limit=1000, lease_until=NOW + LEASE
    )
    return list(claim.messages)


class Offers:
    """A ``supersedes`` callable that records the rows it was offered."""

    def __init__(self, answer: bool) -> None:
        self.answer = answer
        self.offered: list[StoredMessage] = []

    def __call__(self, row: StoredMessage) -> bool:
        self.offered.append(row)
        return self.answer


def test_an_accepted_pending_row_is_replaced_by_the_new_row(harness: Harness) -> None:
    old = harness.store.add(new_message(task_id="reused"))
    new = new_message(task_id="reused", task_name="tests.contract.replacement")
    offers = Offers(True)

    row_id = harness.store.add(new, supersedes=offers)

    assert row_id is not None  # SQLite without AUTOINCREMENT may reuse the deleted id
    assert [row.id for row in offers.offered] == [old]
    assert offers.offered[0].status is MessageStatus.PENDING
    ((stored),) = pending_rows(harness)
    assert (stored.id, stored.task_name, stored.payload) == (row_id, new.task_name, new.payload)


def test_a_refused_pending_row_stays_and_nothing_is_written(harness: Harness) -> None:
    old = harness.store.add(new_message(task_id="kept"))
    offers = Offers(False)

    assert harness.store.add(new_message(task_id="kept"), supersedes=offers) is None

    assert [row.id for row in offers.offered] == [old]
    assert [row.id for row in pending_rows(harness)] == [old]


def test_without_a_pending_row_nothing_is_offered(harness: Harness) -> None:
    harness.store.add(new_message(task_id="published"))
    claim = harness.store.claim_due(
        now=NOW, created_before=FAR_FUTURE, limit=10, lease_until=NOW + LEASE
    )
    harness.store.mark_published(claim, [m.id for m in claim.messages], now=NOW, keep=True)
    offers = Offers(True)

    row_id = harness.store.add(new_message(task_id="published"), supersedes=offers)

    assert offers.offered == []
    assert [row.id for row in pending_rows(harness)] == [row_id]
    assert harness.store.count_by_status()[MessageStatus.PUBLISHED] == 1


def test_a_rolled_back_supersede_restores_the_old_row(harness: Harness) -> None:
    old = harness.store.add(new_message(task_id="restored"))

    with rolled_back(harness.transaction):
        assert harness.store.add(new_message(task_id="restored"), supersedes=Offers(True))

    assert [row.id for row in pending_rows(harness)] == [old]


def test_a_supersede_in_a_committed_transaction_is_kept(harness: Harness) -> None:
    harness.store.add(new_message(task_id="committed"))

    with harness.transaction():
        row_id = harness.store.add(new_message(task_id="committed"), supersedes=Offers(True))

    assert [row.id for row in pending_rows(harness)] == [row_id]


def test_the_old_rows_publisher_then_marks_nothing(harness: Harness) -> None:
    # The row was claimed and published; its publisher's fenced DELETE comes too late.
    harness.store.add(new_message(task_id="late", available_at=NOW))
    claim = harness.store.claim_due(
        now=NOW, created_before=FAR_FUTURE, limit=10, lease_until=NOW + LEASE
    )
    row_id = harness.store.add(new_message(task_id="late"), supersedes=Offers(True))

    marked = harness.store.mark_published(
        claim, [m.id for m in claim.messages], now=NOW, keep=False
    )

    assert marked == 0
    assert harness.read(row_id).status is MessageStatus.PENDING  # type: ignore[arg-type]
