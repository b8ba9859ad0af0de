"""Cancelling on any store (:mod:`celery_outbox.cancelling`): the rows go and their
workflow closes in the caller's transaction, the revoke follows the commit, and a broker
that is down never fails the cancel.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import timedelta

import pytest
from celery import Celery

from celery_outbox import OutboxTask, cancel
from celery_outbox.clock import utcnow
from celery_outbox.registry import install_store
from celery_outbox.state import reset
from celery_outbox.testing import InMemoryOutboxStore
from tests.services import free_port


def body() -> None:
    """A task body."""


@pytest.fixture
def store() -> InMemoryOutboxStore:
    return InMemoryOutboxStore()


@pytest.fixture
def app(store: InMemoryOutboxStore, queue_name: str) -> Iterator[Celery]:
    # a broker nobody listens on: the revoke cannot be sent, and says why
    app = Celery("cancel-unit", broker=f"redis://127.0.0.1:{free_port()}/0", set_as_current=False)
    app.conf.update(task_default_queue=queue_name, outbox_publish_timeout=0.5)
    app.task(base=OutboxTask, name="unit.cancel", shared=False)(body)
    install_store(app, store)
    yield app
    reset(app)
    app.close()


def test_a_cancel_in_a_transaction_revokes_only_after_the_commit(
    app: Celery, store: InMemoryOutboxStore, caplog: pytest.LogCaptureFixture
) -> None:
    task = app.tasks["unit.cancel"]
    with store.atomic():
        parked = task.apply_async(countdown=3600)
        other = task.apply_async(countdown=3600)
    caplog.set_level(logging.WARNING, logger="celery_outbox.cancelling")

    with store.atomic():
        done = cancel(app, task_ids=[parked.id, "unknown"], by="ops")
        assert caplog.records == []  # nothing announced before the commit
    assert list(done.cancelled.values()) == [parked.id]
    assert done.skipped == 1
    assert [row.task_id for row in store.rows.values()] == [other.id]
    assert "by ops" in caplog.text
    assert parked.id in caplog.text


def test_a_broker_that_is_down_fails_the_revoke_not_the_cancel(
    app: Celery, store: InMemoryOutboxStore
) -> None:
    parked = app.tasks["unit.cancel"].apply_async(eta=utcnow() + timedelta(hours=1))
    (row_id,) = store.rows

    done = cancel(app, ids=[row_id])

    assert done.cancelled == {row_id: parked.id}
    assert done.revoked is False
    assert done.revoke_error.startswith("revoke not sent")
    assert store.rows == {}


def test_a_revoke_that_fails_after_the_callers_commit_is_told_and_logged(
    app: Celery, store: InMemoryOutboxStore, caplog: pytest.LogCaptureFixture
) -> None:
    task = app.tasks["unit.cancel"]
    parked, taken = task.apply_async(countdown=3600), task.apply_async(countdown=3600)
    taken_row = next(r for r in store.rows.values() if r.task_id == taken.id)
    store.claim([taken_row.id], now=utcnow() + timedelta(hours=2), lease_until=utcnow())
    caplog.set_level(logging.WARNING, logger="celery_outbox.cancelling")

    with store.atomic():
        done = cancel(app, task_ids=[parked.id, taken.id], by="ops")

    assert (done.in_flight, done.revoked) == ((taken.id,), False)
    assert done.revoke_error.startswith("revoke not sent")  # read after the commit
    [failed] = [r for r in caplog.records if "not sent" in r.getMessage()]
    assert failed.levelno == logging.ERROR  # a row in flight may still run
    assert f"1 of them in flight and may still run: {taken.id}" in failed.getMessage()
