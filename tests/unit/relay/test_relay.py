"""The relay's logic over the in-memory store and kombu's in-memory broker.

What happens to each row after a pass (published, rescheduled, failed, reported as
given up), which rows the on-commit publisher takes without a claim, and the sweeper's
check of a row on the way (its rules: ``test_publishable.py``; the publish pass itself:
``test_producers.py``). A scripted stand-in for the producers is used only where the
test is about the relay's bookkeeping of a pass's outcome; real brokers are in
``tests/integration`` (test_sweep, test_broker_stall, test_sqlalchemy_e2e).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery
from kombu import Connection, Queue

from celery_outbox import OutboxTask
from celery_outbox.config import OutboxConfig
from celery_outbox.publishing.producers import Sent
from celery_outbox.relay.relay import PUBLISH_BACKOFF, Relay
from celery_outbox.store.records import Claim, MessageStatus, NewMessage, StoredMessage
from celery_outbox.testing import InMemoryOutboxStore
from tests.messages import NOW, numbered

LEASE = timedelta(seconds=30)


@pytest.fixture
def app(queue_name: str) -> Iterator[Celery]:
    app = Celery("relay-unit", broker="memory://", set_as_current=False)
    app.conf.update(task_default_queue=queue_name, outbox_publish_max_attempts=3)

    @app.task(base=OutboxTask, name="unit.relay.noop", shared=False)
    def noop(n: int) -> int:
        return n

    yield app
    app.close()


@pytest.fixture
def store() -> InMemoryOutboxStore:
    return InMemoryOutboxStore(clock=lambda: NOW)


@pytest.fixture
def relay(app: Celery, store: InMemoryOutboxStore) -> Iterator[Relay]:
    relay = Relay(app, store=store, config=OutboxConfig.from_celery(app), clock=lambda: NOW)
    yield relay
    relay.close()


def message(app: Celery, n: int, **changes: Any) -> NewMessage:
    """The message of ``noop(n)`` with ``changes`` (:func:`tests.messages.numbered`)."""
    return numbered(app.tasks["unit.relay.noop"], n, **changes)


def add(store: InMemoryOutboxStore, new: NewMessage) -> StoredMessage:
    row_id = store.add(new)
    assert row_id is not None
    return store.rows[row_id]


def claim(store: InMemoryOutboxStore) -> Claim:
    return store.claim_due(now=NOW, created_before=NOW, limit=100, lease_until=NOW + LEASE)


def drain(queue_name: str) -> list[str]:
    ids = []
    with Connection("memory://") as conn:
        queue = Queue(queue_name)(conn.default_channel)
        while (got := queue.get(no_ack=True)) is not None:
            ids.append(got.headers["id"])
    return ids


class ScriptedProducers:
    """Stands for :class:`~celery_outbox.publishing.producers.Producers`: the broker takes the
    rows in
    ``accept`` and refuses the others with ``error`` (pure bookkeeping tests only).
    """

    def __init__(self, accept: set[str], error: str = "broker said no") -> None:
        self.accept, self.error, self.sent = accept, error, []  # type: list[list[str]]

    def close(self) -> None:
        pass

    def send(self, messages: Sequence[StoredMessage], *, path: str) -> Sent:
        self.sent.append([m.task_id for m in messages])
        done = Sent()
        for m in messages:
            if m.task_id in self.accept:
                done.published.append(m.id)
            else:
                done.failed[m.id] = self.error
        return done


# -- a claim's outcome ----------------------------------------------------------------
def test_a_claim_is_published_and_its_rows_removed(
    app: Celery, store: InMemoryOutboxStore, relay: Relay, queue_name: str
) -> None:
    rows = [add(store, message(app, n)) for n in range(3)]

    report = relay.publish_claim(claim(store))

    assert sorted(report.published) == [r.id for r in rows]
    assert (report.failed, report.gave_up) == ({}, frozenset())
    assert store.rows == {}
    assert sorted(drain(queue_name)) == ["task-0", "task-1", "task-2"]


def test_rows_the_broker_refused_are_rescheduled_on_the_backoff(
    app: Celery, store: InMemoryOutboxStore, relay: Relay
) -> None:
    ok, refused = add(store, message(app, 1)), add(store, message(app, 2))
    relay.producers = ScriptedProducers(accept={"task-1"})  # type: ignore[assignment]

    report = relay.publish_claim(claim(store))

    assert report.published == (ok.id,)
    assert report.failed == {refused.id: "broker said no"}
    assert report.gave_up == frozenset()
    row = store.rows[refused.id]
    assert (row.status, row.attempts, row.locked_until) == (MessageStatus.PENDING, 1, None)
    assert NOW + PUBLISH_BACKOFF.base <= row.available_at <= NOW + 2 * PUBLISH_BACKOFF.base


def test_the_relay_gives_up_on_a_rows_last_attempt_and_the_store_records_it(
    app: Celery, store: InMemoryOutboxStore, relay: Relay
) -> None:
    # max attempts 3: a row that failed twice is on its last try, one that failed once is not.
    last = add(store, message(app, 1))
    store.rows[last.id] = replace(last, attempts=2)
    early = add(store, message(app, 2))
    store.rows[early.id] = replace(early, attempts=1)
    relay.producers = ScriptedProducers(accept=set())  # type: ignore[assignment]

    report = relay.publish_claim(claim(store))

    failed = {i for i, r in store.rows.items() if r.status is MessageStatus.FAILED}
    assert report.gave_up == frozenset(failed) == {last.id}
    assert set(report.failed) == {last.id, early.id}
    assert store.rows[last.id].available_at == last.available_at  # a failed row keeps it


def test_the_sweepers_check_fails_unpublishable_rows_for_good(
    app: Celery, store: InMemoryOutboxStore, relay: Relay, queue_name: str
) -> None:
    good = add(store, message(app, 1))
    unknown = add(store, message(app, 2, task_name="unit.relay.gone"))
    garbled = add(store, message(app, 3, payload="not json at all"))

    report = relay.publish_claim(claim(store), validate=True)

    assert report.published == (good.id,)
    assert report.gave_up == {unknown.id, garbled.id}
    assert "unit.relay.gone" in report.failed[unknown.id]
    assert "cannot be decoded" in report.failed[garbled.id]
    assert {store.rows[i].status for i in (unknown.id, garbled.id)} == {MessageStatus.FAILED}
    assert drain(queue_name) == ["task-1"]


def test_without_the_check_every_row_goes_to_the_broker(
    app: Celery, store: InMemoryOutboxStore, relay: Relay
) -> None:
    add(store, message(app, 1, task_name="unit.relay.gone"))
    scripted = ScriptedProducers(accept={"task-1"})
    relay.producers = scripted  # type: ignore[assignment]

    assert relay.publish_claim(claim(store)).published
    assert scripted.sent == [["task-1"]]


# -- after commit -------------------------------------------------------------------------
def test_rows_born_leased_are_published_without_a_claim(
    app: Celery, store: InMemoryOutboxStore, relay: Relay, queue_name: str
) -> None:
    born = add(store, message(app, 1, locked_until=NOW + LEASE))
    gone = StoredMessage.written(message(app, 2, locked_until=NOW + LEASE), 999)  # rolled back

    report = relay.publish_committed([born, gone])

    assert report.published == (born.id,)
    assert store.rows == {}
    assert drain(queue_name) == ["task-1"]


def test_rows_whose_lease_ran_out_are_claimed_first(
    app: Celery, store: InMemoryOutboxStore, relay: Relay, queue_name: str
) -> None:
    late = add(store, message(app, 1, locked_until=NOW - LEASE))
    taken = add(store, message(app, 2, locked_until=NOW - LEASE))
    store.rows[taken.id] = replace(taken, locked_until=NOW + LEASE)  # another publisher has it

    report = relay.publish_committed([late, taken])

    assert report.published == (late.id,)
    assert list(store.rows) == [taken.id]
    assert drain(queue_name) == ["task-1"]


def test_the_after_commit_publisher_never_raises(
    app: Celery, store: InMemoryOutboxStore, relay: Relay
) -> None:
    row = add(store, message(app, 1))

    def broken(*args: object, **kwargs: object) -> Claim:
        raise RuntimeError("database gone")

    store.claim = broken  # type: ignore[method-assign]

    assert relay.publish_committed([row]).published == ()
    assert relay.publish_ids([row.id]).published == ()


def test_one_publisher_per_alias(relay: Relay) -> None:
    assert relay.publisher() is relay.publisher(None)
    assert relay.publisher("other") is relay.publisher("other")
    assert relay.publisher("other") is not relay.publisher()
