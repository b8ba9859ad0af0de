"""Dead letters (write, read, requeue, discard) and delivery counts."""

from __future__ import annotations

import json
import math
from dataclasses import asdict

import pytest
from celery import Celery

from celery_outbox import dead_letters
from celery_outbox.dead_letters import escape_letter
from celery_outbox.exceptions import DeadLetterCompleted, DeadLetterDiscarded
from celery_outbox.registry import install_store
from celery_outbox.store.records import DeadLetterStatus, MessageStatus
from tests.contract.factories import (
    FAR_FUTURE,
    LEASE,
    NOW,
    new_dead_letter,
    new_message,
    rolled_back,
)
from tests.contract.harness import Harness


def test_a_dead_letter_reads_back_as_written(harness: Harness) -> None:
    letter = new_dead_letter()
    letter_id = harness.store.add_dead_letter(letter)

    stored = harness.store.get_dead_letter(letter_id)

    assert stored is not None
    assert stored.id == letter_id
    assert {k: v for k, v in asdict(stored).items() if k in asdict(letter)} == asdict(letter)
    assert (stored.status, stored.requeued_at, stored.requeued_by, stored.requeued_task_id) == (
        DeadLetterStatus.DEAD,
        None,
        "",
        "",
    )


def test_an_unknown_dead_letter_is_none(harness: Harness) -> None:
    assert harness.store.get_dead_letter(10**12) is None


def test_a_dead_letter_written_in_a_rolled_back_transaction_is_gone(harness: Harness) -> None:
    with rolled_back(harness.transaction):
        letter_id = harness.store.add_dead_letter(new_dead_letter())

    assert harness.store.get_dead_letter(letter_id) is None


def test_requeue_adds_a_pending_row_and_marks_the_letter(harness: Harness) -> None:
    letter_id = harness.store.add_dead_letter(new_dead_letter())
    message = new_message(task_id="fresh-id")

    task_id, row_id = harness.store.requeue_dead_letter(letter_id, message, by="alice", now=NOW)

    assert task_id == "fresh-id"
    assert row_id is not None
    letter = harness.store.get_dead_letter(letter_id)
    assert letter is not None
    assert (letter.status, letter.requeued_at, letter.requeued_by, letter.requeued_task_id) == (
        DeadLetterStatus.REQUEUED,
        NOW,
        "alice",
        "fresh-id",
    )
    claim = harness.store.claim_due(
        now=NOW, created_before=FAR_FUTURE, limit=10, lease_until=NOW + LEASE
    )
    assert [(m.id, m.task_id) for m in claim.messages] == [(row_id, "fresh-id")]


def test_requeue_twice_makes_one_row_and_returns_the_first_task_id(harness: Harness) -> None:
    letter_id = harness.store.add_dead_letter(new_dead_letter())
    first = harness.store.requeue_dead_letter(
        letter_id, new_message(task_id="one"), by="a", now=NOW
    )

    again = harness.store.requeue_dead_letter(
        letter_id, new_message(task_id="two"), by="b", now=NOW
    )

    assert again == ("one", None)
    assert first[0] == "one"
    assert harness.store.count_by_status()[MessageStatus.PENDING] == 1


def test_requeue_of_a_discarded_letter_writes_nothing_and_gives_no_task_id(
    harness: Harness,
) -> None:
    # The core turns ("", None) into DeadLetterDiscarded (issue 13 #10), also when the
    # letter was discarded between its read and this locked write.
    letter_id = harness.store.add_dead_letter(new_dead_letter())
    assert harness.store.discard_dead_letter(letter_id) is True

    assert harness.store.requeue_dead_letter(letter_id, new_message(), by="a", now=NOW) == (
        "",
        None,
    )
    letter = harness.store.get_dead_letter(letter_id)
    assert letter is not None
    assert letter.status is DeadLetterStatus.DISCARDED
    assert harness.store.count_by_status()[MessageStatus.PENDING] == 0


def test_core_requeue_of_a_discarded_letter_raises(harness: Harness) -> None:
    app = Celery("contract-requeue", set_as_current=False)
    install_store(app, harness.store)
    letter_id = harness.store.add_dead_letter(new_dead_letter())
    harness.store.discard_dead_letter(letter_id)

    with pytest.raises(DeadLetterDiscarded, match=f"dead letter {letter_id}: it is discarded"):
        dead_letters.requeue(app, letter_id, by="a")
    assert harness.store.count_by_status()[MessageStatus.PENDING] == 0


def test_requeue_in_a_rolled_back_transaction_changes_nothing(harness: Harness) -> None:
    letter_id = harness.store.add_dead_letter(new_dead_letter())
    with rolled_back(harness.transaction):
        harness.store.requeue_dead_letter(letter_id, new_message(), by="a", now=NOW)

    letter = harness.store.get_dead_letter(letter_id)
    assert letter is not None
    assert letter.status is DeadLetterStatus.DEAD
    assert harness.store.count_by_status()[MessageStatus.PENDING] == 0


def test_requeue_of_an_unknown_letter_raises_lookup_error(harness: Harness) -> None:
    with pytest.raises(LookupError):
        harness.store.requeue_dead_letter(10**12, new_message(), by="a", now=NOW)


def test_discard_marks_a_dead_letter_once(harness: Harness) -> None:
    letter_id = harness.store.add_dead_letter(new_dead_letter())

    assert harness.store.discard_dead_letter(letter_id) is True
    assert harness.store.discard_dead_letter(letter_id) is False
    letter = harness.store.get_dead_letter(letter_id)
    assert letter is not None
    assert letter.status is DeadLetterStatus.DISCARDED
    assert harness.store.requeue_dead_letter(letter_id, new_message(), by="a", now=NOW)[1] is None
    assert harness.store.count_by_status()[MessageStatus.PENDING] == 0


def test_discard_of_a_requeued_or_unknown_letter_is_false(harness: Harness) -> None:
    letter_id = harness.store.add_dead_letter(new_dead_letter())
    harness.store.requeue_dead_letter(letter_id, new_message(), by="a", now=NOW)

    assert harness.store.discard_dead_letter(letter_id) is False
    assert harness.store.discard_dead_letter(10**12) is False


def test_a_task_that_completes_after_its_letter_completes_only_its_dead_letters(
    harness: Harness,
) -> None:
    store = harness.store
    dead = store.add_dead_letter(new_dead_letter(task_id="t-done"))
    requeued = store.add_dead_letter(new_dead_letter(task_id="t-done"))
    store.requeue_dead_letter(requeued, new_message(), by="a", now=NOW)
    other = store.add_dead_letter(new_dead_letter(task_id="t-other"))
    with rolled_back(harness.transaction):
        assert store.complete_dead_letters("t-done") == 1
    assert store.get_dead_letter(dead).status is DeadLetterStatus.DEAD  # type: ignore[union-attr]

    with harness.transaction():
        assert store.complete_dead_letters("t-done") == 1
    assert store.complete_dead_letters("t-done") == 0

    statuses = [store.get_dead_letter(i).status for i in (dead, requeued, other)]  # type: ignore[union-attr]
    assert statuses == [
        DeadLetterStatus.COMPLETED,
        DeadLetterStatus.REQUEUED,
        DeadLetterStatus.DEAD,
    ]
    assert store.discard_dead_letter(dead) is False
    assert store.requeue_dead_letter(dead, new_message(), by="a", now=NOW)[1] is None


def test_core_requeue_of_a_completed_letter_raises(harness: Harness) -> None:
    app = Celery("contract-requeue", set_as_current=False)
    install_store(app, harness.store)
    letter_id = harness.store.add_dead_letter(new_dead_letter(task_id="t-late"))
    harness.store.complete_dead_letters("t-late")

    with pytest.raises(DeadLetterCompleted, match=f"letter {letter_id}: its task t-late"):
        dead_letters.requeue(app, letter_id, by="a")
    assert harness.store.count_by_status()[MessageStatus.PENDING] == 0


def test_deliveries_count_from_two_and_are_forgotten(harness: Harness) -> None:
    store = harness.store
    assert [store.record_delivery("t1", now=NOW) for _ in range(3)] == [2, 3, 4]
    assert store.record_delivery("t2", now=NOW) == 2

    store.forget_deliveries("t1")
    store.forget_deliveries("never-seen")

    assert store.record_delivery("t1", now=NOW) == 2
    assert store.record_delivery("t2", now=NOW) == 3


def test_an_escaped_letter_with_unstorable_values_reads_back_on_every_store(
    harness: Harness,
) -> None:
    # NaN/Infinity (jsonb, JSON_VALID), NUL (text) and a lone surrogate (UTF-8): issue 13.
    letter = escape_letter(
        new_dead_letter(
            args=[math.nan, math.inf, "nul\x00", "lone\ud800"],
            kwargs={"x\x00": -math.inf},
            exception_message="bad\x00\udc80",
            traceback="ValueError: bad\x00\udc80\n",
        )
    )
    stored = harness.store.get_dead_letter(harness.store.add_dead_letter(letter))

    assert stored is not None
    assert stored.args == ["NaN", "Infinity", "nul\\u0000", "lone\\ud800"]
    assert stored.kwargs == {"x\\u0000": "-Infinity"}
    assert stored.exception_message == "bad\\u0000\\udc80"
    assert json.loads(stored.options["original"]["exception_message"]) == "bad\x00\udc80"
