"""Random interleavings of claims, marks, failures and time: every store acts like the
in-memory reference, and no row is ever published twice (hypothesis).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_outbox.store.base import OutboxStore
from celery_outbox.store.records import Claim, MessageStatus
from celery_outbox.testing import InMemoryOutboxStore
from tests.contract.factories import FAR_FUTURE, NOW, new_message
from tests.contract.harness import Harness, MemoryHarness

LEASE = timedelta(seconds=10)
PUBLISHERS = 3

publisher = st.integers(0, PUBLISHERS - 1)
operation = st.one_of(
    st.tuples(st.just("add"), st.integers(-5, 5)),
    st.tuples(st.just("claim"), publisher, st.integers(1, 4)),
    st.tuples(st.just("mark"), publisher, st.booleans()),
    st.tuples(st.just("fail"), publisher, st.one_of(st.none(), st.integers(0, 20))),
    st.tuples(st.just("tick"), st.integers(1, 15)),
)


@dataclass
class World:
    """One store driven by the operations, and what it answered."""

    store: OutboxStore
    now: datetime = NOW
    ids: list[int] = field(default_factory=list)
    claims: dict[int, Claim] = field(default_factory=dict)
    answers: list[object] = field(default_factory=list)
    marked: int = 0

    def apply(self, op: tuple[object, ...]) -> None:
        kind = op[0]
        answer: object = None
        if kind == "add":
            # Rows due at the same instant may be claimed in any order (PostgreSQL takes
            # its due index's order): a microsecond per row keeps every due time apart,
            # so the stores and the reference agree on which rows a claim takes.
            due = self.now + _secs(op[1]) + timedelta(microseconds=len(self.ids))
            row_id = self.store.add(new_message(available_at=due))
            assert row_id is not None
            self.ids.append(row_id)
        elif kind == "claim":
            p = int(op[1])  # type: ignore[call-overload]
            lease_until = self.now + LEASE + timedelta(microseconds=p)
            claim = self.store.claim_due(
                now=self.now,
                created_before=FAR_FUTURE,
                limit=int(op[2]),  # type: ignore[call-overload]
                lease_until=lease_until,
            )
            self.claims[p] = claim
            answer = [self._pos(m.id) for m in claim.messages]
        elif kind in ("mark", "fail"):
            answer = self._finish(op)
        else:
            self.now += _secs(op[1])
        self.answers.append(answer)

    def _finish(self, op: tuple[object, ...]) -> object:
        claim = self.claims.pop(int(op[1]), None)  # type: ignore[call-overload]
        if claim is None:
            return None
        ids = [m.id for m in claim.messages]
        if op[0] == "mark":
            changed = self.store.mark_published(claim, ids, now=self.now, keep=bool(op[2]))
            self.marked += changed
            return ("mark", changed)
        retry = None if op[2] is None else self.now + _secs(op[2])
        return (
            "fail",
            self.store.record_failure(claim, ids, error="x", retry_at=retry),
        )

    def _pos(self, row_id: int) -> int:
        return self.ids.index(row_id)

    def summary(self) -> dict[MessageStatus, int]:
        return {s: self.store.count_by_status().get(s, 0) for s in MessageStatus}


def _secs(value: object) -> timedelta:
    return timedelta(seconds=int(value))  # type: ignore[call-overload]


def test_stores_agree_with_the_reference_and_never_publish_twice(harness: Harness) -> None:
    examples = 150 if isinstance(harness, MemoryHarness) else 20

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(st.lists(operation, max_size=30))
    def check(ops: list[tuple[object, ...]]) -> None:
        harness.clear()
        subject, reference = World(harness.store), World(InMemoryOutboxStore())
        for op in ops:
            subject.apply(op)
            reference.apply(op)
        assert subject.answers == reference.answers
        assert subject.summary() == reference.summary()
        # Each mark turns a pending row into a published (or deleted) one: had any row
        # been marked twice, more marks than such rows would have been counted.
        left = subject.summary()
        assert (
            subject.marked
            == len(subject.ids) - left[MessageStatus.PENDING] - left[MessageStatus.FAILED]
        )

    check()
