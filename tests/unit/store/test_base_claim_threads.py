"""No claim on another thread unless the store says so (:mod:`celery_outbox.store.base`)."""

from __future__ import annotations

from celery_outbox.store.base import ClaimThreads, OutboxStore
from celery_outbox.testing import InMemoryOutboxStore


def test_every_store_is_asked_and_by_default_claims_on_the_callers_thread_only() -> None:
    assert issubclass(OutboxStore, ClaimThreads)
    store = InMemoryOutboxStore()
    assert store.claims_aside() is False
    assert store.claims_aside("other") is False
    assert store.end_claims_aside() is None  # nothing to release
