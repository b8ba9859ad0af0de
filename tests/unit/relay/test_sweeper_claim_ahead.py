"""The next claim of a sweep, made on a thread of its own (:mod:`celery_outbox.relay.sweeper`).

A fake store stands for the database here (what is checked is the hand-over between
threads); ``tests/django/test_claim_ahead.py`` sweeps real PostgreSQL rows.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery

from celery_outbox.exceptions import StoreError
from celery_outbox.relay.sweeper import ClaimAhead
from celery_outbox.store.records import Claim, StoredMessage
from tests.messages import NOW, stored

APP = Celery("claim-ahead-unit", broker="memory://", set_as_current=False)


@APP.task(name="unit.claim_ahead.noop", shared=False)
def noop(n: int) -> int:
    return n


def row(n: int, **changes: Any) -> StoredMessage:
    """The stored row of ``noop(n)``, id ``n``."""
    return stored(noop, n, **changes)


class Store:
    """Records what the claim-ahead asks of a store, and on which thread."""

    def __init__(self, *, aside: bool = True, reset_fails: bool = False) -> None:
        self.aside, self.reset_fails = aside, reset_fails
        self.ended: list[str] = []
        self.reset_calls: list[tuple[list[int], Any, Any]] = []

    def claims_aside(self, using: str | None = None) -> bool:
        return self.aside

    def end_claims_aside(self) -> None:
        self.ended.append(threading.current_thread().name)

    def reset(self, ids: list[int], *, now: Any, using: str | None = None) -> int:
        if self.reset_fails:
            raise StoreError("the database went away")
        self.reset_calls.append((ids, now, using))
        return len(ids)


def claim_of(*rows: Any) -> Claim:
    return Claim(messages=tuple(rows), lease_until=NOW + timedelta(minutes=1))


def test_a_claim_started_runs_on_the_claiming_thread_and_is_taken() -> None:
    store, where = Store(), []
    claim = claim_of(row(1))

    def claiming() -> Claim:
        where.append(threading.current_thread().name)
        return claim

    with ClaimAhead(store, claiming, using="db") as ahead:  # type: ignore[arg-type]
        assert ahead.start() is True
        assert ahead.take() is claim
        assert ahead.start() is True  # the same thread claims again
        assert ahead.take() is claim
    assert where[0].startswith("celery-outbox-claim")
    assert len(set(where)) == 1
    assert store.ended == where[:1]  # its connections released on that thread, once
    assert store.reset_calls == []  # every claim was taken: nothing to give back


def test_a_store_that_does_not_allow_it_starts_nothing() -> None:
    store = Store(aside=False)
    with ClaimAhead(store, lambda: pytest.fail("claimed"), using=None) as ahead:  # type: ignore[arg-type]
        assert ahead.start() is False
        with pytest.raises(RuntimeError, match="no claim was started"):
            ahead.take()
    assert store.ended == []  # no thread was started


def test_a_claim_not_taken_is_given_back_due_as_its_oldest_row() -> None:
    late, early = row(1, available_at=NOW), row(2, available_at=NOW - timedelta(seconds=5))
    store = Store()
    with ClaimAhead(store, lambda: claim_of(late, early), using="db") as ahead:  # type: ignore[arg-type]
        ahead.start()
        with pytest.raises(RuntimeError, match="already being made"):
            ahead.start()
    assert store.reset_calls == [([1, 2], early.available_at, "db")]
    assert len(store.ended) == 1


def test_a_failed_claim_raises_where_it_is_taken_and_on_leaving() -> None:
    def failing() -> Claim:
        raise StoreError("claim outbox rows: connection refused")

    store = Store()
    with ClaimAhead(store, failing, using=None) as ahead:  # type: ignore[arg-type]
        ahead.start()
        with pytest.raises(StoreError, match="connection refused"):
            ahead.take()
    assert len(store.ended) == 1

    leaving = ClaimAhead(store, failing, using=None)  # type: ignore[arg-type]
    with pytest.raises(StoreError, match="connection refused"), leaving as ahead:
        ahead.start()  # the claim's error leaves with the block
    assert len(store.ended) == 2


def test_leaving_on_an_error_logs_what_the_give_back_raised_and_keeps_that_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = Store(reset_fails=True)
    leaving = ClaimAhead(store, lambda: claim_of(row(1)), using=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="the publish failed"), leaving as ahead:  # noqa: PT012
        ahead.start()
        raise ValueError("the publish failed")
    assert "wait for their lease to end" in caplog.text
    assert len(store.ended) == 1
