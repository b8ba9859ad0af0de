"""Holding and draining rows (:mod:`celery_outbox.testing.draining`) over the in-memory store and
broker.
"""

from __future__ import annotations

import pytest
from celery import Celery

from celery_outbox.relay.relay import relay_for
from celery_outbox.testing import InMemoryOutboxStore
from celery_outbox.testing.draining import (
    HeldRelay,
    claim_rows,
    publish_claimed,
    publishing_held,
    run_claimed,
)
from tests.unit.test_task import TASK, app, queued, ran, store

__all__ = ["app", "store"]  # the fixtures of tests/unit/test_task.py


def test_held_publishing_leaves_committed_rows_pending_then_restores_the_relay(
    app: Celery, store: InMemoryOutboxStore, queue_name: str
) -> None:
    before = relay_for(app)
    with publishing_held(app) as held:
        assert relay_for(app) is held
        with store.atomic():
            app.tasks[TASK].delay(1)
        app.tasks[TASK].delay(2)  # outside a transaction: "published" at once, held too
    assert isinstance(held, HeldRelay)
    assert relay_for(app) is before
    assert queued(queue_name) == []
    assert len(store.rows) == 2


def test_claim_rows_takes_existing_rows_due_or_not_in_written_order(
    app: Celery, store: InMemoryOutboxStore
) -> None:
    with publishing_held(app):
        task = app.tasks[TASK]
        later = task.apply_async((1,), countdown=3600)
        now = task.delay(2)
    ids = sorted(store.rows)

    claim = claim_rows(app, [*reversed(ids), 999], using=None)

    assert [m.task_id for m in claim.messages] == [later.id, now.id]


def test_run_claimed_removes_the_row_then_runs_the_task(
    app: Celery, store: InMemoryOutboxStore
) -> None:
    with publishing_held(app):
        app.tasks[TASK].delay(3, b=4)
    claim = claim_rows(app, list(store.rows), using=None)

    assert run_claimed(app, claim, claim.messages[0], using=None) == 7
    assert (ran, store.rows) == ([(3, 4)], {})


def test_run_claimed_names_a_task_the_app_does_not_know(
    app: Celery, store: InMemoryOutboxStore
) -> None:
    other = Celery("other", broker="memory://", set_as_current=False)
    with publishing_held(app):
        app.tasks[TASK].delay(1)
    claim = claim_rows(app, list(store.rows), using=None)

    with pytest.raises(LookupError, match=rf"cannot run '{TASK}'.*app 'other' has no task"):
        run_claimed(other, claim, claim.messages[0], using=None)
    other.close()


def test_publish_claimed_sends_the_rows_to_the_broker(
    app: Celery, store: InMemoryOutboxStore, queue_name: str
) -> None:
    with publishing_held(app):
        result = app.tasks[TASK].delay(1)
        claim = claim_rows(app, list(store.rows), using=None)
        report = publish_claimed(app, claim, using=None)

    assert (report.failed, queued(queue_name), store.rows) == ({}, [result.id], {})
