"""Where the stores used to disagree (issue 14 #6): what a ``failed`` row's due time is,
and how rows deferred in one transaction are grouped into on-commit batches.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import timedelta

from celery_outbox.store.records import MessageStatus, StoredMessage
from tests.contract.factories import FAR_FUTURE, LEASE, NOW, Calls, new_message, written
from tests.contract.harness import Harness

SECOND = timedelta(seconds=1)


def _add(h: Harness) -> int:
    row_id = h.store.add(new_message(available_at=NOW - SECOND))
    assert row_id is not None
    return row_id


def _fail_once(h: Harness, row_id: int, *, retry_at: object) -> None:
    claim = h.store.claim_due(now=NOW, created_before=FAR_FUTURE, limit=10, lease_until=NOW + LEASE)
    assert [m.id for m in claim.messages] == [row_id]
    changed = h.store.record_failure(
        claim,
        [row_id],
        error="down",
        retry_at=retry_at,  # type: ignore[arg-type]
    )
    assert changed == 1


def test_a_row_failed_for_good_keeps_its_due_time(harness: Harness) -> None:
    row_id = _add(harness)

    _fail_once(harness, row_id, retry_at=None)

    row = harness.read(row_id)
    assert (row.status, row.attempts) == (MessageStatus.FAILED, 1)
    assert row.available_at == NOW - SECOND


def test_a_rescheduled_row_is_due_at_its_retry_time(harness: Harness) -> None:
    row_id = _add(harness)

    _fail_once(harness, row_id, retry_at=NOW + 30 * SECOND)

    row = harness.read(row_id)
    assert (row.status, row.attempts) == (MessageStatus.PENDING, 1)
    assert row.available_at == NOW + 30 * SECOND


class _Publisher:
    """Stands for the relay: ``publish_committed`` bound per alias like ``Relay.publisher``."""

    def __init__(self) -> None:
        self.calls = Calls()

    def publish_committed(self, messages: Sequence[StoredMessage], *, using: str | None) -> None:
        self.calls(messages, using)


def test_equal_publishers_share_one_batch(harness: Harness) -> None:
    relay = _Publisher()
    with harness.transaction():
        ids = [_add(harness) for _ in range(2)]
        for row_id in ids:  # a new, equal partial for every dispatch
            publish = functools.partial(relay.publish_committed, using=None)
            harness.store.defer_publish(written(row_id), publish)

    assert relay.calls.calls == [(tuple(ids), None)]


def test_different_publishers_get_one_batch_each(harness: Harness) -> None:
    first, second = Calls(), Calls()
    with harness.transaction():
        a, b, c = (_add(harness) for _ in range(3))
        harness.store.defer_publish(written(a), first)
        harness.store.defer_publish(written(b), second)
        harness.store.defer_publish(written(c), first)

    assert first.calls == [((a, c),)]
    assert second.calls == [((b,),)]


def test_publishers_of_different_aliases_get_one_batch_each(harness: Harness) -> None:
    relay = _Publisher()
    with harness.transaction():
        a, b = _add(harness), _add(harness)
        harness.store.defer_publish(
            written(a), functools.partial(relay.publish_committed, using=None)
        )
        harness.store.defer_publish(
            written(b), functools.partial(relay.publish_committed, using="x")
        )

    assert sorted(relay.calls.calls, key=str) == sorted([((a,), None), ((b,), "x")], key=str)
