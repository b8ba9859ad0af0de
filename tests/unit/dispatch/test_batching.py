"""Batched dispatch (:mod:`celery_outbox.dispatch.batching`) through real dispatches on the
in-memory
store: what is collected, when it is written, and where errors are raised.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from celery import Celery, group

from celery_outbox import BatchWriteError, OutboxTask, PayloadError, StoreError, batched_dispatch
from celery_outbox.registry import install_store
from celery_outbox.signals import task_dispatched
from celery_outbox.state import reset
from celery_outbox.store.records import NewMessage
from celery_outbox.testing import InMemoryOutboxStore


class CountingStore(InMemoryOutboxStore):
    """The in-memory store, counting its ``add`` and ``add_many`` calls (or failing them)."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[int] = []
        self.adds = 0
        self.fail = False

    def add(self, message: NewMessage, **kwargs: Any) -> int | None:
        self.adds += 1
        return super().add(message, **kwargs)

    def add_many(
        self, messages: Sequence[NewMessage], *, using: str | None = None
    ) -> list[int | None]:
        if self.fail:
            raise StoreError("the database refused the rows")
        self.batches.append(len(messages))
        adds, result = self.adds, super().add_many(messages, using=using)
        self.adds = adds  # add_many's own adds are not single dispatches
        return result


def body(*args: Any) -> None:
    """A task body."""


@pytest.fixture
def store() -> CountingStore:
    return CountingStore()


@pytest.fixture
def app(queue_name: str, store: CountingStore) -> Iterator[Celery]:
    app = Celery("batching", broker="memory://", set_as_current=False)
    app.conf.task_default_queue = queue_name
    app.conf.broker_connection_timeout = 0.1
    app.task(base=OutboxTask, name="b.t", shared=False)(body)
    install_store(app, store)
    yield app
    reset(app)
    app.close()


def test_a_group_in_a_transaction_writes_its_members_with_one_add_many(
    app: Celery, store: CountingStore
) -> None:
    t = app.tasks["b.t"]
    with store.atomic():
        result = group([t.s(n) for n in range(5)]).apply_async()
        assert store.batches == [5]
        assert store.adds == 0
        ids = sorted(store.rows)
        assert [store.rows[i].task_id for i in ids] == [r.id for r in result.results]


def test_a_group_outside_a_transaction_adds_each_row_at_its_call(
    app: Celery, store: CountingStore
) -> None:
    group([app.tasks["b.t"].s(n) for n in range(3)]).apply_async()
    assert store.batches == []
    assert store.adds == 3


def test_the_block_raises_at_the_call_and_writes_the_rest_at_exit(
    app: Celery, store: CountingStore
) -> None:
    t = app.tasks["b.t"]
    sent: list[Any] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        sent.append(kwargs["row_id"])

    task_dispatched.connect(receiver, weak=False)
    try:
        with store.atomic():
            with batched_dispatch(app=app):
                t.delay(1)
                with pytest.raises(PayloadError):
                    t.delay(object())
                t.delay(2)
                assert store.rows == {}  # written and announced at the exit
                assert sent == []
            assert store.batches == [2]
            assert sent == sorted(store.rows)
    finally:
        task_dispatched.disconnect(receiver)


def test_an_error_leaving_the_block_still_writes_what_was_collected(
    app: Celery, store: CountingStore
) -> None:
    def fail_after_one() -> None:
        with batched_dispatch(app=app):
            app.tasks["b.t"].delay(1)
            raise KeyError("the caller's own error")

    with store.atomic():
        with pytest.raises(KeyError):
            fail_after_one()
        assert store.batches == [1]
        assert len(store.rows) == 1


def test_a_failed_write_raises_at_exit_naming_the_tasks(app: Celery, store: CountingStore) -> None:
    store.fail = True
    with pytest.raises(BatchWriteError, match=r"b\.t\[pick-me\]") as raised:  # noqa: SIM117
        with store.atomic(), batched_dispatch(app=app):
            app.tasks["b.t"].apply_async((1,), task_id="pick-me")
    assert isinstance(raised.value.__cause__, StoreError)
    assert store.rows == {}


def test_dispatches_in_a_savepoint_opened_inside_the_block_are_added_at_once(
    app: Celery, store: CountingStore
) -> None:
    t = app.tasks["b.t"]
    with store.atomic():
        with batched_dispatch(app=app):
            t.delay(1)
            with store.atomic():
                t.delay(2)
                assert store.adds == 1
        assert store.batches == [1]
        assert len(store.rows) == 2


def test_a_block_opened_outside_a_transaction_batches_nothing(
    app: Celery, store: CountingStore
) -> None:
    with batched_dispatch(app=app), store.atomic():
        app.tasks["b.t"].delay(1)
        assert store.adds == 1
    assert store.batches == []


def test_a_group_inside_the_block_joins_its_batch(app: Celery, store: CountingStore) -> None:
    t = app.tasks["b.t"]
    with store.atomic(), batched_dispatch(app=app):
        t.delay(0)
        group([t.s(n) for n in range(3)]).apply_async()
    assert store.batches == [4]
