"""Dead letters in the ORM store, and ``using=`` across two databases."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import datetime
from typing import Any

import pytest
from django.db import transaction

from celery_outbox.exceptions import StoreDataError
from celery_outbox.store.records import DeadLetterStatus, NewDeadLetter
from django_outbox.models import DeadLetter, OutboxMessage
from tests.contract.factories import written
from tests.django.helpers import later, rolled_back


def letter(now: datetime, task_id: str = "dead-1") -> NewDeadLetter:
    """A dead letter of ``tests.flaky``."""
    return NewDeadLetter(
        task_id=task_id,
        task_name="tests.flaky",
        args=[1, "a"],
        kwargs={"k": [True, None]},
        options={"queue": "q"},
        exception_type="builtins.ValueError",
        exception_message="nope",
        traceback="Traceback ...",
        retries=5,
        first_failed_at=later(now, -60),
        failed_at=now,
    )


@pytest.mark.django_db(transaction=True)
def test_add_and_get_a_dead_letter(store: Any, now: datetime) -> None:
    letter_id = store.add_dead_letter(letter(now))
    stored = store.get_dead_letter(letter_id)
    assert stored.id == letter_id
    assert (stored.args, stored.kwargs, stored.options) == (
        [1, "a"],
        {"k": [True, None]},
        {"queue": "q"},
    )
    assert (stored.status, stored.retries, stored.failed_at) == (DeadLetterStatus.DEAD, 5, now)
    assert store.get_dead_letter(letter_id + 1000) is None


@pytest.mark.django_db(transaction=True)
def test_dead_letter_rolls_back_with_the_callers_transaction(store: Any, now: datetime) -> None:
    with rolled_back():
        store.add_dead_letter(letter(now))
    assert DeadLetter.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_requeue_twice_makes_one_row(store: Any, message: Any, now: datetime) -> None:
    letter_id = store.add_dead_letter(letter(now))
    task_id, row_id = store.requeue_dead_letter(letter_id, message("new-id"), by="alice", now=now)
    assert (task_id, row_id) == ("new-id", OutboxMessage.objects.get().id)
    again = store.requeue_dead_letter(letter_id, message("other-id"), by="bob", now=now)
    assert again == ("new-id", None)
    assert list(OutboxMessage.objects.values_list("task_id", flat=True)) == ["new-id"]
    stored = store.get_dead_letter(letter_id)
    assert (stored.status, stored.requeued_by, stored.requeued_task_id, stored.requeued_at) == (
        DeadLetterStatus.REQUEUED,
        "alice",
        "new-id",
        now,
    )


@pytest.mark.django_db(transaction=True)
def test_requeue_of_an_unknown_letter_raises_lookup_error(
    store: Any, message: Any, now: datetime
) -> None:
    with pytest.raises(LookupError):
        store.requeue_dead_letter(12345, message("x"), by="alice", now=now)
    assert OutboxMessage.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_discard_only_dead_letters(store: Any, message: Any, now: datetime) -> None:
    dead, requeued = store.add_dead_letter(letter(now)), store.add_dead_letter(letter(now))
    store.requeue_dead_letter(requeued, message("n"), by="alice", now=now)
    assert store.discard_dead_letter(dead) is True
    assert store.discard_dead_letter(dead) is False
    assert store.discard_dead_letter(requeued) is False
    assert store.get_dead_letter(dead).status == DeadLetterStatus.DISCARDED


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_using_selects_the_database_and_its_transaction(
    store: Any, message: Any, now: datetime
) -> None:
    published: list[list[int]] = []
    with transaction.atomic(using="other"):
        row_id = store.add(message("elsewhere"), using="other")
        store.defer_publish(
            written(row_id),
            lambda messages: published.append([m.id for m in messages]),
            using="other",
        )
        assert published == []
    assert published == [[row_id]]
    assert OutboxMessage.objects.using("other").filter(task_id="elsewhere").exists()
    assert not OutboxMessage.objects.using("default").exists()
    claim = store.claim([row_id], now=now, lease_until=later(now, 30), using="other")
    assert store.mark_published(claim, [row_id], now=now, keep=False, using="other") == 1
    letter_id = store.add_dead_letter(letter(now), using="other")
    assert store.get_dead_letter(letter_id, using="other") is not None
    assert store.get_dead_letter(letter_id) is None


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "fields",
    [{"args": [math.nan]}, {"kwargs": {"k": "\ud800"}}, {"exception_message": "nul\x00"}],
    ids=["nan", "surrogate", "nul"],
)
def test_a_value_the_database_refuses_is_a_store_data_error(
    store: Any, now: datetime, fields: dict[str, Any]
) -> None:
    # Not an outage: the worker stores the letter escaped instead of retrying the write.
    with pytest.raises(StoreDataError):
        store.add_dead_letter(replace(letter(now), **fields))
    assert not DeadLetter.objects.exists()
