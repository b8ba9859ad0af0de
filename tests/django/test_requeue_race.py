"""A discard racing a bulk requeue on real PostgreSQL (issue 13 #10): a letter discarded
meanwhile is reported skipped, never requeued with an empty task id, and dispatches nothing.
"""

from __future__ import annotations

import io
import threading
import time
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection

from celery_outbox import dead_letters as core
from celery_outbox.exceptions import DeadLetterDiscarded
from celery_outbox.signals import dead_letter_requeued
from celery_outbox.store.records import DeadLetterStatus
from django_outbox.dead_letters import RequeueResult, requeue_letters
from django_outbox.models import DeadLetter, OutboxMessage
from tests.django import admin_app
from tests.django.admin_app import APP_PATH, BASE_TIME, make_letter
from tests.worker import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

LETTERS = 300


@pytest.fixture(autouse=True)
def _outbox_app(settings: Any) -> None:
    settings.DJANGO_OUTBOX_CELERY_APP = APP_PATH


def many_letters(count: int) -> list[int]:
    """``count`` dead letters, oldest first (the order a bulk requeue takes them)."""
    template = make_letter()
    DeadLetter.objects.bulk_create(
        DeadLetter(
            **{
                **{f.attname: getattr(template, f.attname) for f in DeadLetter._meta.fields},
                "id": None,
                "task_id": f"race-{n}",
                "failed_at": BASE_TIME.replace(microsecond=n + 1),
            }
        )
        for n in range(count - 1)
    )
    return list(DeadLetter.objects.order_by("failed_at", "id").values_list("id", flat=True))


def status_ids(status: DeadLetterStatus) -> set[int]:
    return set(DeadLetter.objects.filter(status=status.value).values_list("id", flat=True))


def discard_from_the_newest(ids: list[int], discarded: list[int]) -> None:
    """Once the requeue has started, discard every letter still dead, newest first."""
    try:
        wait_for(
            lambda: DeadLetter.objects.filter(status="requeued").exists(),
            timeout=30,
            what="the first requeue",
        )
        for letter_id in reversed(ids):
            if core.discard(admin_app.app, letter_id, using="default"):
                discarded.append(letter_id)
    finally:
        connection.close()


def test_a_letter_discarded_during_a_bulk_requeue_is_skipped_not_reported_requeued() -> None:
    ids = many_letters(LETTERS)
    discarded: list[int] = []
    outcome: list[RequeueResult] = []
    dispatched: list[str] = []

    def on_requeued(task_id: str, **kwargs: Any) -> None:
        dispatched.append(task_id)

    dead_letter_requeued.connect(on_requeued, weak=False)

    def requeue_all() -> None:
        try:
            outcome.append(requeue_letters(DeadLetter.objects.all(), by="race", app=admin_app.app))
        finally:
            connection.close()

    threads = [
        threading.Thread(target=requeue_all),
        threading.Thread(target=discard_from_the_newest, args=(ids, discarded)),
    ]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    dead_letter_requeued.disconnect(on_requeued)
    (result,) = outcome
    requeued, gone = status_ids(DeadLetterStatus.REQUEUED), status_ids(DeadLetterStatus.DISCARDED)
    print(
        f"{LETTERS} letters: reported requeued {len(result.requeued)}, really {len(requeued)}; "
        f"skipped {result.skipped}; discarded {len(gone)} ({time.monotonic() - started:.1f} s)"
    )
    assert discarded, "the race did not happen"
    assert requeued, "the race did not happen"
    assert set(result.requeued) == requeued
    assert set(discarded) == gone
    assert requeued | gone == set(ids)
    assert result.skipped == len(set(ids) - requeued) > 0
    assert result.failed == {}
    assert "" not in result.requeued.values()
    # One dispatch per requeued letter, with the task id reported; none for the others.
    assert sorted(dispatched) == sorted(result.requeued.values())


def test_requeue_of_a_discarded_letter_raises_and_dispatches_nothing() -> None:
    letter = make_letter(status=DeadLetterStatus.DISCARDED.value)
    with pytest.raises(DeadLetterDiscarded, match=rf"dead letter {letter.pk}: it is discarded"):
        letter.requeue(by="someone")
    letter.refresh_from_db()
    assert (letter.status, letter.requeued_task_id) == ("discarded", "")
    assert not OutboxMessage.objects.exists()


def test_requeue_command_report_gives_the_skipped_count() -> None:
    make_letter(status=DeadLetterStatus.DISCARDED.value)  # not selected: not dead
    kept = make_letter()
    out = io.StringIO()
    call_command("outbox", "requeue", "--all", stdout=out)
    assert "default: requeued 1 dead letter(s), 0 failed, 0 skipped" in out.getvalue()
    assert status_ids(DeadLetterStatus.REQUEUED) == {kept.pk}


def test_the_queryset_requeues_and_discards_through_the_one_requeue_path() -> None:
    # The first dead-letter contract's queryset methods (DESIGN.md, turn 2 surfaces).
    requeued: list[str] = []

    def heard(sender: Any, task_id: str, **kwargs: Any) -> None:
        requeued.append(task_id)

    dead = [make_letter(exception_type="shop.errors.Timeout") for _ in range(3)]
    settled = make_letter(exception_type="shop.errors.Timeout", status="completed")
    other = make_letter(exception_type="builtins.KeyError")
    dead_letter_requeued.connect(heard)
    try:
        result = DeadLetter.objects.filter(exception_type="shop.errors.Timeout").requeue(by="ops")
    finally:
        dead_letter_requeued.disconnect(heard)

    assert isinstance(result, RequeueResult)
    assert sorted(result.requeued) == sorted(letter.pk for letter in dead)
    assert (result.skipped, result.failed) == (1, {})  # the completed letter: never requeued
    assert sorted(requeued) == sorted(result.requeued.values())  # through core.requeue
    assert set(OutboxMessage.objects.values_list("task_id", flat=True)) == set(requeued)
    for letter in dead:
        letter.refresh_from_db()
        assert (letter.status, letter.requeued_by) == ("requeued", "ops")

    assert DeadLetter.objects.filter(pk__in=[settled.pk, other.pk]).discard() == 1
    statuses = dict(
        DeadLetter.objects.filter(pk__in=[settled.pk, other.pk]).values_list("pk", "status")
    )
    assert statuses == {settled.pk: "completed", other.pk: "discarded"}
