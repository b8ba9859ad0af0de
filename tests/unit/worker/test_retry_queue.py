"""``retry_queue``: every retry (ETA, parked, explicit, autoretry) goes to it, and the
task's own routing travels with it, so a dead letter is requeued where the task came from.
"""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import Ignore, Retry

from celery_outbox import OutboxTask
from celery_outbox.registry import install_store
from celery_outbox.testing import InMemoryOutboxStore
from celery_outbox.worker.attempt import HOME_HEADER, Attempt, attempt_from_request
from celery_outbox.worker.outcomes import after_failure
from celery_outbox.worker.republish import requeue_later, schedule_retry
from tests.unit.worker.support import TASK, attempt_of, deliver, queued, queued_ids

NOW = datetime.now(timezone.utc)
HOME = {"queue": "q", "exchange": None, "routing_key": None, "priority": None}


class Down(RuntimeError):
    """What ``flaky`` raises."""


def flaky(n: int) -> None:
    """Always fails."""
    raise Down(f"down for {n}")


@pytest.fixture
def store(app: Celery) -> InMemoryOutboxStore:
    store = InMemoryOutboxStore(clock=lambda: NOW)  # the database's clock parks the row
    install_store(app, store)
    return store


def retry(app: Celery, attempt: Attempt, **kwargs: Any) -> Any:
    return after_failure(
        app.tasks[TASK], attempt, Down(), explicit=True, rng=random.Random(), **kwargs
    )


def test_an_eta_retry_goes_to_the_retry_queue_carrying_the_tasks_own_routing(
    app: Celery, queue_name: str, store: InMemoryOutboxStore
) -> None:
    retries = f"{queue_name}-retries"
    result = schedule_retry(
        app.tasks[TASK],
        attempt_of("t1", queue_name),
        Down(),
        delay=timedelta(seconds=1),
        park=False,
        now=NOW,
        queue=retries,
    )
    assert isinstance(result, Retry)
    assert queued_ids(queue_name) == []
    (headers,) = queued(retries)
    assert (headers["id"], headers["retries"]) == ("t1", 1)
    assert json.loads(headers[HOME_HEADER]) == {**HOME, "queue": queue_name}


def test_a_parked_retry_is_stored_for_the_retry_queue(
    app: Celery, queue_name: str, store: InMemoryOutboxStore
) -> None:
    retries = f"{queue_name}-retries"
    schedule_retry(
        app.tasks[TASK],
        attempt_of("t2", queue_name),
        Down(),
        delay=timedelta(minutes=10),
        park=True,
        now=NOW,
        queue=retries,
    )
    (row,) = store.rows.values()
    assert row.options["routing_key"] == retries
    assert retries in row.options["declare"]  # the sweeper declares it before publishing
    assert json.loads(row.options["headers"][HOME_HEADER])["queue"] == queue_name


def test_a_retry_parked_because_its_eta_publish_failed_is_stored_for_the_retry_queue(
    app: Celery, queue_name: str, store: InMemoryOutboxStore
) -> None:
    app.conf.broker_write_url = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    app.conf.outbox_publish_timeout = 0.2
    install_store(app, store)  # again: settings changed after the fixture installed it
    retries = f"{queue_name}-retries"
    schedule_retry(
        app.tasks[TASK],
        attempt_of("t8", queue_name),
        Down(),
        delay=timedelta(seconds=1),
        park=False,
        now=NOW,
        queue=retries,
    )
    (row,) = store.rows.values()
    assert (row.task_id, row.available_at) == ("t8", NOW + timedelta(seconds=1))
    assert row.options["routing_key"] == retries


def test_a_queue_given_to_retry_wins_over_the_retry_queue(
    app: Celery, queue_name: str, store: InMemoryOutboxStore
) -> None:
    app.conf.outbox_retry_queue = f"{queue_name}-retries"
    other = f"{queue_name}-other"
    retry(app, attempt_of("t3", queue_name), countdown=1, overrides={"queue": other})
    (headers,) = queued(other)
    assert HOME_HEADER not in headers
    assert queued_ids(f"{queue_name}-retries") == []


def test_the_setting_applies_to_tasks_without_their_own_retry_queue(
    app: Celery, queue_name: str, store: InMemoryOutboxStore
) -> None:
    app.conf.outbox_retry_queue = f"{queue_name}-retries"
    retry(app, attempt_of("t4", queue_name), countdown=1)
    assert queued_ids(f"{queue_name}-retries") == ["t4"]
    assert queued_ids(queue_name) == []


def test_without_a_retry_queue_a_retry_goes_back_where_it_came_from(
    app: Celery, queue_name: str, store: InMemoryOutboxStore
) -> None:
    retry(app, attempt_of("t5", queue_name), countdown=1)
    (headers,) = queued(queue_name)
    assert HOME_HEADER not in headers


def test_autoretry_goes_to_the_tasks_retry_queue_and_its_dead_letter_keeps_the_home(
    app: Celery, queue_name: str, store: InMemoryOutboxStore
) -> None:
    app.conf.outbox_retry_queue = f"{queue_name}-setting"  # the task's own wins
    retries = f"{queue_name}-retries"
    app.task(
        base=OutboxTask,
        name="unit.flaky",
        shared=False,
        retry_queue=retries,
        max_retries=1,
        retry_backoff=0.01,
    )(flaky)
    task = app.tasks["unit.flaky"]

    with pytest.raises(Retry):
        deliver(task, 1, task_id="t6", queue=queue_name)
    (headers,) = queued(retries)
    assert queued_ids(f"{queue_name}-setting") == []

    # The retry, delivered from the retry queue, fails for good: a dead letter.
    with pytest.raises(Down):
        deliver(
            task,
            1,
            task_id="t6",
            queue=retries,
            retries=1,
            **{HOME_HEADER: headers[HOME_HEADER]},
        )
    (letter,) = store.letters.values()
    assert letter.options["queue"] == queue_name  # requeued to the task's own queue


def test_a_retry_put_back_while_the_store_is_down_keeps_the_tasks_own_routing(
    app: Celery, queue_name: str
) -> None:
    retries = f"{queue_name}-retries"
    home = {**HOME, "queue": queue_name}
    attempt = Attempt(
        task_name=TASK,
        task_id="t9",
        args=(1,),
        retries=1,
        delivery_info={"exchange": "", "routing_key": retries},
        options={"queue": retries},
        home=home,
    )
    with pytest.raises(Ignore):
        requeue_later(app.tasks[TASK], attempt, RuntimeError("store down"))
    (headers,) = queued(retries)  # put back where it was delivered from
    assert json.loads(headers[HOME_HEADER]) == home


def test_the_home_header_is_read_back_and_a_foreign_one_ignored(app: Celery) -> None:
    task = app.tasks[TASK]
    delivery = {"exchange": "", "routing_key": "retries"}

    def request(header: Any) -> Any:
        task.push_request(id="t7", args=(1,), delivery_info=delivery, **{HOME_HEADER: header})
        try:
            return attempt_from_request(task, task.request)
        finally:
            task.pop_request()

    assert request(json.dumps(HOME)).routing() == HOME
    for foreign in ("not json", json.dumps({"queue": "q"}), json.dumps([1]), 5):
        assert request(foreign).routing()["queue"] == "retries"
