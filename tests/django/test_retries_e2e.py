"""Retries that never sleep, parked waits and dead letters: real PostgreSQL, a real
broker (Redis, then RabbitMQ) and a real worker (issue 5's acceptance).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from kombu import Connection

from celery_outbox.exceptions import OutboxConfigError
from celery_outbox.store.records import MessageStatus
from celery_outbox.sweep_task import sweep_app
from celery_outbox.worker.republish import NO_ERROR_REASON, RETRY_REASON_HEADER
from django_outbox.models import DeadLetter, OutboxMessage
from django_outbox.store.transactions import settle
from tests.brokers import purge_queue
from tests.django.conftest import close_app
from tests.django.helpers import database_url, postgres_only
from tests.django.retry_tasks import FLAKY_BACKOFF, attempts, create_retry_app
from tests.worker import SharedWorker, WorkerProcess, WorkerStartError, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), postgres_only]

#: Seconds the parked task asks to wait: well above ``outbox_park_after`` (1 s), and long
#: enough for the checks made while it is parked (a targeted inspect answers in ms).
PARKED_WAIT = 3.0


@dataclass
class Run:
    """The test's app (same tasks as the worker's) and where the worker logs attempts."""

    app: Celery
    queue: str
    output: Path
    env: dict[str, str]
    start: Callable[..., WorkerProcess]
    #: Attempts in :attr:`output` before this test (the file is the module's, like the worker).
    since: int = 0

    def attempts(self, task: str | None = None) -> list[dict[str, Any]]:
        mine = attempts(self.output)[self.since :]
        return [a for a in mine if task is None or a["task"] == task]

    def wait_attempts(self, task: str, count: int, timeout: float = 30.0) -> list[dict[str, Any]]:
        wait_for(
            lambda: len(self.attempts(task)) >= count,
            timeout=timeout,
            what=f"{count} attempt(s) of {task}",
        )
        return self.attempts(task)


@pytest.fixture(scope="module")
def attempts_output(broker_url: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the module's workers on ``broker_url`` log attempts."""
    return tmp_path_factory.mktemp("attempts") / "attempts.jsonl"


@pytest.fixture
def run(
    broker_url: str,
    module_broker_queue: str,
    attempts_output: Path,
    shared_worker: SharedWorker,
) -> Iterator[Run]:
    # One worker per module and broker while the tests ask for the same settings (each
    # waits for the outcome of what it dispatched); other settings get a new worker. What
    # a test dispatched with no worker running is purged, never left to the next test.
    purge_queue(broker_url, module_broker_queue)
    base_env = {
        "OUTBOX_TEST_BROKER": broker_url,
        "OUTBOX_TEST_QUEUE": module_broker_queue,
        "OUTBOX_TEST_OUTPUT": str(attempts_output),
        "OUTBOX_DJANGO_DB_URL": database_url(),
    }
    app = create_retry_app(broker_url, module_broker_queue)

    def start(
        conf: dict[str, Any] | None = None, *, env: dict[str, str] | None = None, **options: Any
    ) -> WorkerProcess:
        return shared_worker.get(
            "tests.django.retry_worker",
            queue=module_broker_queue,
            env={**base_env, "OUTBOX_TEST_CONF": json.dumps(conf or {}), **(env or {})},
            **options,
        )

    since = len(attempts(attempts_output))
    yield Run(
        app=app,
        queue=module_broker_queue,
        output=attempts_output,
        env=base_env,
        start=start,
        since=since,
    )
    close_app(app)


def test_fails_twice_then_succeeds_on_the_windows(run: Run) -> None:
    run.start()
    run.app.tasks["retry.flaky"].delay("k", 2)
    tries = run.wait_attempts("retry.flaky", 3)
    time.sleep(1.0)
    assert len(run.attempts("retry.flaky")) == 3
    assert [t["retries"] for t in tries] == [0, 1, 2]
    assert len({t["id"] for t in tries}) == 1  # one task id across retries
    first, second = tries[1]["at"] - tries[0]["at"], tries[2]["at"] - tries[1]["at"]
    b, slack = FLAKY_BACKOFF, 0.35  # slack: broker round trip and worker pickup
    assert 0 <= first <= b + slack
    assert b - 0.05 <= second <= 2 * b + slack


def test_always_failing_task_is_one_dead_letter(run: Run) -> None:
    run.start()
    result = run.app.tasks["retry.always"].delay("a")
    run.wait_attempts("retry.always", 3)
    wait_for(lambda: DeadLetter.objects.exists(), timeout=15, what="the dead letter")
    time.sleep(0.5)
    assert len(run.attempts("retry.always")) == 3
    letter = DeadLetter.objects.get()
    assert (letter.task_id, letter.task_name, letter.retries) == (result.id, "retry.always", 2)
    assert letter.exception_type == "builtins.ValueError"
    assert letter.exception_message == "always failing a"
    assert "ValueError: always failing a" in letter.traceback
    assert letter.args == ["a"]
    assert letter.status == "dead"


def test_dont_autoretry_for_is_dead_on_first_failure(run: Run) -> None:
    run.start()
    run.app.tasks["retry.permanent"].delay("p")
    wait_for(lambda: DeadLetter.objects.exists(), timeout=15, what="the dead letter")
    letter = DeadLetter.objects.get()
    assert letter.exception_type == "tests.django.retry_tasks.Permanent"
    assert letter.retries == 0
    assert len(run.attempts("retry.permanent")) == 1


def test_retry_max_elapsed_ends_retries_on_time(run: Run) -> None:
    run.start()
    run.app.tasks["retry.deadline"].delay("d")
    wait_for(lambda: DeadLetter.objects.exists(), timeout=20, what="the dead letter")
    letter = DeadLetter.objects.get()
    elapsed = (letter.failed_at - letter.first_failed_at).total_seconds()
    assert 1.5 <= elapsed <= 2.5
    assert letter.retries >= 3


def test_long_wait_is_parked_off_the_broker_and_worker(run: Run, tmp_path: Path) -> None:
    worker = run.start(
        {"outbox_park_after": 1.0}, extra_args=("-B", "-s", str(tmp_path / "beat-schedule"))
    )
    result = run.app.tasks["retry.parked"].delay("w", PARKED_WAIT)
    first = run.wait_attempts("retry.parked", 1)[0]
    # The dispatched row is deleted a moment after its publish (or superseded by the
    # parked one): what is left with the task id is the parked row.
    assert settle()
    wait_for(
        lambda: OutboxMessage.objects.filter(task_id=result.id).exists(),
        timeout=5,
        what="the parked row",
    )
    row = OutboxMessage.objects.get(task_id=result.id)
    assert row.status == MessageStatus.PENDING.value
    assert row.available_at.timestamp() - first["at"] >= PARKED_WAIT - 0.5
    assert queue_length(run) == 0
    assert scheduled(run.app, worker) == []  # the worker holds no ETA for it
    tries = run.wait_attempts("retry.parked", 2, timeout=30)
    assert tries[1]["at"] - first["at"] >= PARKED_WAIT - 0.1
    assert tries[1]["retries"] == 1
    wait_for(
        lambda: not OutboxMessage.objects.filter(task_id=result.id).exists(),
        timeout=5,
        what="the published row to be removed",
    )


def test_failed_eta_publish_parks_the_retry(run: Run) -> None:
    # The worker publishes through a broker that refuses (closed port); it consumes fine.
    run.start(
        {"broker_write_url": f"redis://127.0.0.1:{closed_port()}/0", "outbox_publish_timeout": 0.5}
    )
    # The worker may run the first attempt before this process has removed the row it
    # published the task from (on RabbitMQ the consumer often wins the race with the
    # publisher's confirm): the parked retry then takes that row's place.
    result = run.app.tasks["retry.flaky"].delay("e", 1)
    run.wait_attempts("retry.flaky", 1)
    wait_for(
        lambda: OutboxMessage.objects.filter(task_id=result.id).exists(),
        timeout=10,
        what="the retry parked after its ETA publish failed",
    )
    wait_for(
        lambda: sweep_app(run.app).published > 0 or not OutboxMessage.objects.exists(),
        timeout=15,
        interval=0.3,
        what="the sweep to publish the parked retry",
    )
    tries = run.wait_attempts("retry.flaky", 2)
    assert [t["retries"] for t in tries] == [0, 1]


@pytest.mark.slow
def test_task_killing_its_worker_becomes_a_dead_letter(run: Run) -> None:
    run.start({"outbox_max_deliveries": 2}, pool="prefork", concurrency=2)
    run.app.tasks["retry.suicide"].delay("s")
    wait_for(lambda: DeadLetter.objects.exists(), timeout=60, what="the dead letter")
    letter = DeadLetter.objects.get()
    assert letter.exception_type == "celery_outbox.exceptions.TooManyDeliveries"
    assert len(run.attempts("retry.suicide")) == 2  # the third delivery did not run
    for n in range(5):
        run.app.tasks["retry.healthy"].delay(f"h{n}")
    run.wait_attempts("retry.healthy", 5)


#: Bad options the issue saw lose tasks (issue 13, item 4), each on a task of its own.
MISCONFIGURED = {
    "retry.bad_backoff_tiny": {"retry_backoff": 1e-7},
    "retry.bad_max_retries": {"max_retries": "3"},
    "retry.bad_autoretry_for": {"autoretry_for": ["ProviderError"]},
    "retry.bad_jitter": {"retry_jitter": "yes"},
}


def test_a_worker_with_bad_task_options_refuses_to_start(run: Run) -> None:
    tasks = {**MISCONFIGURED, "retry.celery_idiom": {"retry_backoff": True, "retry_jitter": True}}
    with pytest.raises(WorkerStartError) as caught:
        run.start(ready_timeout=30.0, env={"OUTBOX_TEST_MISCONFIGURED": json.dumps(tasks)})
    log = str(caught.value)
    for name, options in MISCONFIGURED.items():
        (option, value), *_ = options.items()
        assert f"Task '{name}'" in log
        assert f"{option}={value!r}" in log
    assert "retry.celery_idiom" not in log  # Celery's retry_backoff=True is a base of 1 s


def test_a_dispatch_with_bad_task_options_is_refused(run: Run) -> None:
    app = create_retry_app(run.env["OUTBOX_TEST_BROKER"], run.queue, misconfigured=MISCONFIGURED)
    try:
        for name, options in MISCONFIGURED.items():
            with pytest.raises(OutboxConfigError, match=f"'{name}'.*{next(iter(options))}="):
                app.tasks[name].delay("x")
        app.tasks["retry.always"].delay("fine")  # the other tasks dispatch as before
    finally:
        close_app(app)
    assert not OutboxMessage.objects.filter(task_name__in=MISCONFIGURED).exists()


def test_a_bad_option_found_at_failure_is_a_dead_letter_not_a_lost_task(run: Run) -> None:
    run.start()
    changed = run.app.tasks["retry.options_changed"].delay("o").id
    bad_max = run.app.tasks["retry.bad_retry_call"].delay("m", {"max_retries": "3"}).id
    bad_countdown = run.app.tasks["retry.bad_retry_call"].delay("c", {"countdown": "soon"}).id
    wait_for(lambda: DeadLetter.objects.count() >= 3, timeout=20, what="three dead letters")
    time.sleep(1.0)
    letters = {letter.task_id: letter for letter in DeadLetter.objects.all()}
    assert set(letters) == {changed, bad_max, bad_countdown}
    for task_id, text in [
        (changed, "max_retries='3'"),
        (bad_max, "max_retries='3'"),
        (bad_countdown, "countdown='soon'"),
    ]:
        assert letters[task_id].exception_type == "celery_outbox.exceptions.OutboxConfigError"
        assert text in letters[task_id].exception_message
        assert "ValueError" in letters[task_id].exception_message
    assert sorted(a["key"] for a in run.attempts()) == ["c", "m", "o"]  # each ran once


def test_retry_with_new_arguments_runs_the_next_attempt_with_them(run: Run) -> None:
    run.start()
    result = run.app.tasks["retry.new_arguments"].delay("n")
    bad = run.app.tasks["retry.bad_retry_call"].delay("b", {"args": "not a list"}).id
    tries = run.wait_attempts("retry.new_arguments", 3)
    wait_for(lambda: DeadLetter.objects.exists(), timeout=15, what="the bad call's dead letter")
    time.sleep(0.5)
    assert [t["key"] for t in run.attempts("retry.new_arguments")] == ["n:1", "n:2", "n:3"]
    assert [t["retries"] for t in tries] == [0, 1, 2]
    assert {t["id"] for t in tries} == {result.id}
    letter = DeadLetter.objects.get()  # a retry() argument it cannot send: named, not lost
    assert letter.task_id == bad
    assert "args='not a list'" in letter.exception_message


def test_a_retry_naming_no_error_says_so_and_one_in_an_except_names_that_error(
    run: Run,
) -> None:
    """``self.retry()`` with no ``exc``: parked and logged without an error (never as
    ``RetriesExhausted``); in an ``except`` block, the handled error is the retry's, and
    the dead letter's once retries are exhausted.
    """
    worker = run.start({"outbox_park_after": 1.0})  # no beat: it would outlive the test
    result = run.app.tasks["retry.bare"].delay("bare", PARKED_WAIT)
    run.wait_attempts("retry.bare", 1)
    assert settle()  # the dispatched row's DELETE: what is left with the task id is parked
    wait_for(
        lambda: OutboxMessage.objects.filter(task_id=result.id).exists(),
        timeout=5,
        what="the parked row",
    )
    row = OutboxMessage.objects.get(task_id=result.id)
    assert row.options["headers"][RETRY_REASON_HEADER] == NO_ERROR_REASON
    wait_for(
        lambda: sweep_app(run.app).published > 0,
        timeout=PARKED_WAIT + 15,
        interval=0.3,
        what="the sweep to publish the parked retry once due",
    )
    wait_for(
        lambda: DeadLetter.objects.filter(task_id=result.id).exists(),
        timeout=30,
        what="the dead letter of the exhausted retry",
    )
    letter = DeadLetter.objects.get(task_id=result.id)
    assert letter.exception_type.endswith("LookupError"), letter.exception_type
    assert "missing bare" in letter.exception_message
    assert len(run.attempts("retry.bare")) == 2
    log = worker.log_text()
    retried = [line for line in log.splitlines() if result.id in line and "Retry" in line]
    assert retried, log[-3000:]
    assert "RetriesExhausted" not in log, retried


def queue_length(run: Run) -> int:
    """Messages waiting in the test's queue (not counting ones a worker holds)."""
    with Connection(run.env["OUTBOX_TEST_BROKER"]) as conn:
        channel = conn.default_channel
        if conn.transport.driver_type == "redis":  # an empty Redis queue is no key at all
            return int(channel.client.llen(run.queue))
        return int(channel.queue_declare(run.queue, passive=True).message_count)


def scheduled(app: Celery, worker: WorkerProcess) -> list[Any]:
    """The ETA tasks the worker holds, from ``celery inspect scheduled``."""
    # Only this worker is asked, and its reply ends the wait (not the full timeout).
    inspect = app.control.inspect(destination=[worker.nodename()], timeout=3.0, limit=1)
    replies = inspect.scheduled() or {}
    assert replies, f"no worker answered inspect (log: {worker.log_text()[-2000:]})"
    return [task for tasks in replies.values() for task in tasks]


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
