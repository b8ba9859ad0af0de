"""Claims stop at a byte budget (``max_bytes``), in every store (issue 13 #7).

A row is taken while the rows before it in the claim hold fewer than ``max_bytes`` of
payload: a batch of large rows is short, a row larger than the budget is claimed alone,
and the rows left over go to the next claim.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from celery_outbox.store.records import Claim
from tests.contract.factories import FAR_FUTURE, LEASE, NOW, new_message
from tests.contract.harness import Harness

BUDGET = 1000


def add_sized(h: Harness, *sizes: int) -> list[int]:
    """Rows with payloads of ``sizes`` bytes, due one microsecond apart (oldest first)."""
    ids = []
    for n, size in enumerate(sizes):
        message = new_message(
            available_at=NOW - timedelta(seconds=10) + n * timedelta(microseconds=1)
        )
        row_id = h.store.add(replace(message, payload="x" * size))
        assert row_id is not None
        ids.append(row_id)
    return ids


def claim_due(h: Harness, max_bytes: int | None = BUDGET, limit: int = 100) -> list[int]:
    claim: Claim = h.store.claim_due(
        now=NOW,
        created_before=FAR_FUTURE,
        limit=limit,
        lease_until=NOW + LEASE,
        max_bytes=max_bytes,
    )
    return [m.id for m in claim.messages]


def claim(h: Harness, ids: list[int], max_bytes: int | None = BUDGET) -> list[int]:
    found = h.store.claim(ids, now=NOW, lease_until=NOW + LEASE, max_bytes=max_bytes)
    return [m.id for m in found.messages]


def test_claim_due_stops_at_the_row_that_reaches_the_budget(harness: Harness) -> None:
    rows = add_sized(harness, 400, 400, 400, 400, 400)

    assert claim_due(harness) == rows[:3]  # 0, 400, 800 bytes before each: < 1000
    assert claim_due(harness) == rows[3:]
    assert claim_due(harness) == []


def test_a_row_larger_than_the_budget_is_claimed_alone(harness: Harness) -> None:
    rows = add_sized(harness, 5000, 10, 10)

    assert claim_due(harness) == rows[:1]
    assert claim_due(harness) == rows[1:]


def test_the_row_limit_still_applies_within_the_budget(harness: Harness) -> None:
    rows = add_sized(harness, 10, 10, 10)

    assert claim_due(harness, limit=2) == rows[:2]
    assert claim_due(harness, limit=2) == rows[2:]


def test_no_budget_claims_every_row(harness: Harness) -> None:
    rows = add_sized(harness, 5000, 5000, 5000)

    assert claim_due(harness, max_bytes=None) == rows


def test_claim_of_ids_stops_at_the_budget_oldest_first(harness: Harness) -> None:
    rows = add_sized(harness, 600, 600, 600)

    assert claim(harness, list(reversed(rows))) == rows[:2]
    assert claim(harness, rows) == rows[2:]
