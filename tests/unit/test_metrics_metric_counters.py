"""``celery_outbox.metrics``: what each signal counts (the receivers, fed by the
library's signals; real publishes and workers: tests/integration/test_metrics_counters.py).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from celery import Celery

from celery_outbox import signals
from celery_outbox.clock import utcnow
from celery_outbox.store.records import StoredMessage
from tests.contract.factories import new_message

pytest.importorskip("prometheus_client")

from prometheus_client import REGISTRY

import celery_outbox.metrics  # noqa: F401 - connects the counters

LATENCY = "celery_outbox_publish_latency_seconds"


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def row(
    *, waited: timedelta, attempts: int = 0, created_ago: timedelta | None = None
) -> StoredMessage:
    now = utcnow()
    stored = StoredMessage.written(replace(new_message(), available_at=now - waited), 1)
    created = None if created_ago is None else now - created_ago
    return replace(stored, attempts=attempts, created_at=created)


def slower_than(seconds: str) -> float:
    return sample(f"{LATENCY}_bucket", le="+Inf") - sample(f"{LATENCY}_bucket", le=seconds)


def test_a_published_row_counts_on_its_path_and_observes_its_wait_since_due() -> None:
    now_path, over_60 = sample("celery_outbox_published_total", path="now"), slower_than("60.0")

    signals.message_published.send(
        sender=Celery(set_as_current=False),
        task_ids=["a"],
        messages=[row(waited=timedelta(seconds=100))],
        path="now",
    )

    assert sample("celery_outbox_published_total", path="now") == now_path + 1
    assert slower_than("60.0") == over_60 + 1


def test_a_row_whose_publish_failed_waited_since_its_creation() -> None:
    over_900, over_300 = slower_than("900.0"), slower_than("300.0")

    signals.message_published.send(
        sender=None,
        task_ids=["a"],
        messages=[row(waited=timedelta(0), attempts=2, created_ago=timedelta(seconds=600))],
        path="sweep",
    )

    assert (slower_than("900.0"), slower_than("300.0")) == (over_900, over_300 + 1)


def test_a_row_due_later_than_now_observes_no_negative_wait() -> None:
    count, fastest = sample(f"{LATENCY}_count"), sample(f"{LATENCY}_bucket", le="0.005")

    signals.message_published.send(
        sender=None, task_ids=["a"], messages=[row(waited=-timedelta(seconds=5))], path="commit"
    )

    assert sample(f"{LATENCY}_count") == count + 1
    assert sample(f"{LATENCY}_bucket", le="0.005") == fastest + 1


def test_a_send_without_rows_counts_no_path() -> None:
    signals.message_published.send(sender=None, task_ids=[])

    assert REGISTRY.get_sample_value("celery_outbox_published_total", {"path": ""}) is None


def test_failed_publishes_count_each_row() -> None:
    errors = sample("celery_outbox_publish_errors_total")

    signals.message_publish_failed.send(sender=None, task_ids=["a", "b"], path="sweep", gave_up=0)

    assert sample("celery_outbox_publish_errors_total") == errors + 2


class Task:
    name = "proj.tasks.send_mail"


def test_retries_dead_letters_and_duplicates_are_labelled_by_task_name_only() -> None:
    parked = sample("celery_outbox_retries_total", path="parked")
    dead = sample("celery_outbox_dead_lettered_total", task=Task.name)
    skipped = sample("celery_outbox_duplicates_skipped_total", task=Task.name)

    signals.task_retry_scheduled.send(sender=Task(), task_id="t-1", eta=utcnow(), path="parked")
    signals.task_dead_lettered.send(sender=Task(), letter_id=1, task_id="t-1", exception=None)
    signals.task_duplicate_skipped.send(sender=Task(), task_id="t-1", completed_at=utcnow())

    assert sample("celery_outbox_retries_total", path="parked") == parked + 1
    assert sample("celery_outbox_dead_lettered_total", task=Task.name) == dead + 1
    assert sample("celery_outbox_duplicates_skipped_total", task=Task.name) == skipped + 1
    text = "".join(str(metric.samples) for metric in REGISTRY.collect())
    assert "t-1" not in text


def test_disconnected_counters_stop_counting_and_connect_resumes() -> None:
    from celery_outbox import metrics as metric_counters

    app, before = Celery(set_as_current=False), sample("celery_outbox_retries_total", path="eta")
    metric_counters.disconnect()
    try:
        signals.task_retry_scheduled.send(sender=app, path="eta")
        assert sample("celery_outbox_retries_total", path="eta") == before
    finally:
        metric_counters.connect()
    signals.task_retry_scheduled.send(sender=app, path="eta")
    assert sample("celery_outbox_retries_total", path="eta") == before + 1
