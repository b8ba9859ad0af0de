"""Dispatch: ``add``, ``on_commit`` and ``defer_publish``, inside and outside transactions."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from celery_outbox.store.records import Claim, MessageStatus, StoredMessage
from tests.contract.factories import (
    FAR_FUTURE,
    LEASE,
    NOW,
    Calls,
    new_message,
    rolled_back,
    written,
)
from tests.contract.harness import Harness


def claim_all(h: Harness, *, now: datetime = NOW) -> Claim:
    return h.store.claim_due(
        now=now, created_before=FAR_FUTURE, limit=1000, lease_until=now + LEASE
    )


def test_add_writes_a_pending_row_read_back_as_written(harness: Harness) -> None:
    message = new_message(available_at=NOW - timedelta(seconds=1))
    row_id = harness.store.add(message)

    assert isinstance(row_id, int)
    (stored,) = claim_all(harness).messages
    assert stored.id == row_id
    assert (stored.task_id, stored.task_name, stored.payload) == (
        message.task_id,
        message.task_name,
        message.payload,
    )
    assert dict(stored.options) == dict(message.options)
    assert stored.available_at == message.available_at
    assert stored.available_at.utcoffset() == timedelta(0)
    assert (stored.status, stored.attempts, stored.last_error) == (MessageStatus.PENDING, 0, "")
    assert stored.created_at is not None
    assert stored.created_at.tzinfo is not None
    assert stored.published_at is None


def test_add_with_a_pending_task_id_writes_nothing(harness: Harness) -> None:
    first = harness.store.add(new_message(task_id="same"))

    assert harness.store.add(new_message(task_id="same")) is None
    with harness.transaction():
        assert harness.store.add(new_message(task_id="same")) is None
    assert [m.id for m in claim_all(harness).messages] == [first]


def test_add_reuses_a_task_id_once_its_row_is_no_longer_pending(harness: Harness) -> None:
    harness.store.add(new_message(task_id="again"))
    claim = claim_all(harness)
    harness.store.mark_published(claim, [m.id for m in claim.messages], now=NOW, keep=True)

    assert harness.store.add(new_message(task_id="again")) is not None
    assert harness.store.count_by_status()[MessageStatus.PUBLISHED] == 1


def test_add_in_a_committed_transaction_is_kept(harness: Harness) -> None:
    with harness.transaction():
        row_id = harness.store.add(new_message())

    assert [m.id for m in claim_all(harness).messages] == [row_id]


def test_add_in_a_rolled_back_transaction_leaves_nothing(harness: Harness) -> None:
    with rolled_back(harness.transaction):
        assert harness.store.add(new_message()) is not None

    assert claim_all(harness).messages == ()


def test_add_in_a_rolled_back_savepoint_leaves_only_the_outer_rows(harness: Harness) -> None:
    with harness.transaction():
        kept = harness.store.add(new_message())
        with rolled_back(harness.savepoint):
            harness.store.add(new_message())

    assert [m.id for m in claim_all(harness).messages] == [kept]


def test_on_commit_runs_after_commit_not_before(harness: Harness) -> None:
    calls = Calls()
    with harness.transaction():
        harness.store.on_commit(lambda: calls("first"))
        harness.store.on_commit(lambda: calls("second"))
        assert calls.calls == []

    assert calls.calls == [("first",), ("second",)]


def test_on_commit_never_runs_on_rollback(harness: Harness) -> None:
    calls = Calls()
    with rolled_back(harness.transaction):
        harness.store.on_commit(lambda: calls("no"))

    assert calls.calls == []


def test_on_commit_drops_callbacks_of_a_rolled_back_savepoint(harness: Harness) -> None:
    calls = Calls()
    with harness.transaction():
        harness.store.on_commit(lambda: calls("outer"))
        with rolled_back(harness.savepoint):
            harness.store.on_commit(lambda: calls("rolled back"))
        with harness.savepoint():
            harness.store.on_commit(lambda: calls("released"))
            with rolled_back(harness.savepoint):
                harness.store.on_commit(lambda: calls("inner rolled back"))
        assert calls.calls == []

    assert calls.calls == [("outer",), ("released",)]


def test_on_commit_outside_a_transaction_runs_at_once(harness: Harness) -> None:
    calls = Calls()
    harness.store.on_commit(lambda: calls("now"))

    assert calls.calls == [("now",)]


def test_awaits_commit_tells_a_waiting_callback_from_a_dropped_or_finished_one(
    harness: Harness,
) -> None:
    def kept() -> None: ...
    def released() -> None: ...
    def dropped() -> None: ...

    with harness.transaction():
        harness.store.on_commit(kept)
        with harness.savepoint():
            harness.store.on_commit(released)
        with rolled_back(harness.savepoint):
            harness.store.on_commit(dropped)
            assert harness.store.awaits_commit(dropped)
        waiting = [harness.store.awaits_commit(c) for c in (kept, released, dropped)]

    assert waiting == [True, True, False]
    assert not harness.store.awaits_commit(kept)  # it ran


def test_defer_publish_calls_once_per_transaction_with_every_row(harness: Harness) -> None:
    publish = Calls()
    with harness.transaction():
        ids = [harness.store.add(new_message()) for _ in range(3)]
        for row_id in ids:
            assert row_id is not None
            harness.store.defer_publish(written(row_id), publish)
        assert publish.calls == []

    assert publish.calls == [(tuple(ids),)]


def test_defer_publish_survives_the_rollback_of_the_savepoint_it_began_in(harness: Harness) -> None:
    publish = Calls()
    with harness.transaction():
        with rolled_back(harness.savepoint):
            dropped = harness.store.add(new_message())
            assert dropped is not None
            harness.store.defer_publish(written(dropped), publish)
        kept = harness.store.add(new_message())
        assert kept is not None
        harness.store.defer_publish(written(kept), publish)

    ((ids,),) = publish.calls
    assert kept in ids
    # A rolled-back row may still be listed; claiming it finds nothing.
    assert [m.id for m in harness.store.claim(ids, now=NOW, lease_until=NOW + LEASE).messages] == [
        kept
    ]


def test_defer_publish_in_a_rolled_back_transaction_calls_nothing(harness: Harness) -> None:
    publish = Calls()
    with rolled_back(harness.transaction):
        row_id = harness.store.add(new_message())
        assert row_id is not None
        harness.store.defer_publish(written(row_id), publish)

    assert publish.calls == []


def test_defer_publish_outside_a_transaction_publishes_at_once(harness: Harness) -> None:
    publish = Calls()
    row_id = harness.store.add(new_message())
    assert row_id is not None
    harness.store.defer_publish(written(row_id), publish)

    assert publish.calls == [((row_id,),)]


def test_each_transaction_gets_its_own_batch(harness: Harness) -> None:
    publish = Calls()
    for _ in range(2):
        with harness.transaction():
            row_id = harness.store.add(new_message())
            assert row_id is not None
            harness.store.defer_publish(written(row_id), publish)

    assert [len(ids) for (ids,) in publish.calls] == [1, 1]
    assert publish.calls[0] != publish.calls[1]


def test_on_commit_callbacks_see_the_committed_rows(harness: Harness) -> None:
    seen: list[list[int]] = []

    def publish(messages: Sequence[StoredMessage]) -> None:
        claim = harness.store.claim([m.id for m in messages], now=NOW, lease_until=NOW + LEASE)
        seen.append([m.id for m in claim.messages])

    with harness.transaction():
        row_id = harness.store.add(new_message())
        assert row_id is not None
        harness.store.defer_publish(written(row_id), publish)

    assert seen == [[row_id]]
