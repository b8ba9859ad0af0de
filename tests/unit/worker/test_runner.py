"""Running one delivery: a failure is handled once, a redelivery is counted, and
``retry()`` finds the attempt that runs (no flag on Celery's request).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import datetime, timezone

import pytest
from celery import Celery
from celery.exceptions import Retry

from celery_outbox import OutboxTask
from celery_outbox.config import OutboxConfig
from celery_outbox.exceptions import OutboxConfigError, TooManyDeliveries
from celery_outbox.registry import install_store
from celery_outbox.testing import InMemoryOutboxStore
from celery_outbox.worker import runner
from celery_outbox.worker.attempt import Attempt
from tests.unit.worker.support import queued

NOW = datetime.now(timezone.utc)


def body(n: int) -> int:
    """A task body."""
    return n


@pytest.fixture
def app(queue_name: str) -> Iterator[Celery]:
    app = Celery("runner-unit", broker="memory://", set_as_current=False)
    app.conf.update(task_default_queue=queue_name, outbox_max_deliveries=2)
    app.task(base=OutboxTask, name="unit.runner", shared=False, max_retries=1)(body)
    yield app
    app.close()


@pytest.fixture
def store(app: Celery) -> InMemoryOutboxStore:
    store = InMemoryOutboxStore()
    install_store(app, store)
    return store


def attempt_of(queue: str, *, retries: int = 0, redelivered: bool = False) -> Attempt:
    return Attempt(
        task_name="unit.runner",
        task_id="t1",
        args=(1,),
        retries=retries,
        delivery_info={"exchange": "", "routing_key": queue, "redelivered": redelivered},
        options={"queue": queue},
    )


def test_a_failure_is_retried_on_an_eta(
    app: Celery, store: InMemoryOutboxStore, queue_name: str
) -> None:
    def fail() -> None:
        raise ValueError("boom")

    with pytest.raises(Retry):
        runner.run_attempt(
            app.tasks["unit.runner"], attempt_of(queue_name), fail, rng=random.Random(1)
        )
    (headers,) = queued(queue_name)
    assert (headers["id"], headers["retries"]) == ("t1", 1)
    assert not store.letters


def test_a_dead_lettering_retry_call_is_not_handled_twice(
    app: Celery, store: InMemoryOutboxStore, queue_name: str
) -> None:
    task = app.tasks["unit.runner"]
    seen: list[Attempt | None] = []

    def call_retry() -> None:
        attempt = runner.running_attempt()
        seen.append(attempt)
        assert attempt is not None
        raise runner.retry(task, attempt, ValueError("no more"), rng=random.Random())

    with pytest.raises(ValueError, match="no more"):
        runner.run_attempt(task, attempt_of(queue_name, retries=1), call_retry, rng=random.Random())
    assert seen[0] is not None
    assert seen[0].task_id == "t1"
    assert len(store.letters) == 1  # retries exhausted: one letter, not one per handler
    assert queued(queue_name) == []
    assert runner.running_attempt() is None  # nothing left behind after the run


def test_a_redelivery_past_the_limit_is_a_dead_letter_without_running(
    app: Celery, store: InMemoryOutboxStore, queue_name: str
) -> None:
    task, ran = app.tasks["unit.runner"], []
    store.record_delivery("t1", now=NOW)
    store.record_delivery("t1", now=NOW)
    with pytest.raises(TooManyDeliveries):
        runner.run_attempt(
            task,
            attempt_of(queue_name, redelivered=True),
            lambda: ran.append(1),
            rng=random.Random(),
        )
    assert ran == []
    (letter,) = store.letters.values()
    assert letter.exception_type == "celery_outbox.exceptions.TooManyDeliveries"


def test_a_redelivery_within_the_limit_runs(
    app: Celery, store: InMemoryOutboxStore, queue_name: str
) -> None:
    result = runner.run_attempt(
        app.tasks["unit.runner"],
        attempt_of(queue_name, redelivered=True),
        lambda: "ran",
        rng=random.Random(),
    )
    assert result == "ran"
    assert not store.letters


def misconfigure(app: Celery, **conf: object) -> None:
    """Change settings of a running app to bad values, and make the outbox read them
    again (settings are read once: without ``reset`` the change is not seen at all).
    """
    from celery_outbox.state import state_of

    app.conf.update(conf)
    state_of(app).config = None


def test_settings_changed_at_runtime_are_not_read_until_the_state_is_reset(
    app: Celery, store: InMemoryOutboxStore, queue_name: str
) -> None:
    OutboxConfig.from_celery(app)  # read at worker start
    app.conf.outbox_max_deliveries = "5"
    result = runner.run_attempt(
        app.tasks["unit.runner"],
        attempt_of(queue_name, redelivered=True),
        lambda: "ran",
        rng=random.Random(),
    )
    assert result == "ran"


def test_a_bad_delivery_limit_read_at_runtime_dead_letters_the_redelivery(
    app: Celery, store: InMemoryOutboxStore, queue_name: str
) -> None:
    task = app.tasks["unit.runner"]  # the worker started with good settings
    misconfigure(app, outbox_max_deliveries="5")
    ran: list[int] = []
    with pytest.raises(OutboxConfigError, match=r"outbox_max_deliveries='5'.*unit\.runner\[t1\]"):
        runner.run_attempt(
            task,
            attempt_of(queue_name, redelivered=True),
            lambda: ran.append(1),
            rng=random.Random(),
        )
    assert ran == []
    (letter,) = store.letters.values()
    assert letter.task_id == "t1"
    assert "outbox_max_deliveries='5'" in letter.exception_message


def test_a_bad_park_after_read_at_failure_dead_letters_the_attempt(
    app: Celery, store: InMemoryOutboxStore, queue_name: str
) -> None:
    task = app.tasks["unit.runner"]  # the worker started with good settings
    misconfigure(app, outbox_park_after=float("nan"))

    def fail() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        runner.run_attempt(task, attempt_of(queue_name), fail, rng=random.Random())
    (letter,) = store.letters.values()
    assert letter.task_id == "t1"
    assert "outbox_park_after=nan" in letter.exception_message
    assert queued(queue_name) == []
