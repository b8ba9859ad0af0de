"""``manage.py outbox status|sweep|relay|purge`` on real PostgreSQL, real brokers, a real worker."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import IO, Any

import pytest
from celery import Celery
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import transaction

from celery_outbox.dispatch.envelope import build_message
from celery_outbox.state import reset
from celery_outbox.store.records import MessageStatus
from django_outbox.management.outbox_commands import subcommands
from django_outbox.models import CompletedTask, OutboxMessage
from django_outbox.store import DjangoOutboxStore
from tests.django import outbox_command_app
from tests.django.admin_app import make_letter
from tests.django.celery_app import RECORD, create_app, runs
from tests.django.helpers import database_url
from tests.django.outbox_command_app import APP_PATH
from tests.services import free_port
from tests.worker import REPO_ROOT, WorkerProcess, wait_for, worker_env

pytestmark = pytest.mark.django_db(transaction=True)

LONG_AGO = timedelta(hours=1)


def now() -> datetime:
    return datetime.now(timezone.utc)


def outbox(*args: str) -> str:
    """Run ``manage.py outbox *args``; its standard output."""
    out = io.StringIO()
    call_command("outbox", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def use_app(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Celery]]:
    """Make ``outbox`` use a fresh app built by ``use_app(broker_url, queue, **conf)``."""
    settings.DJANGO_OUTBOX_CELERY_APP = APP_PATH
    apps: list[Celery] = []

    def use(broker_url: str, queue: str, **conf: Any) -> Celery:
        app = create_app(broker_url, queue, outbox_beat_schedule=False, **conf)
        monkeypatch.setattr(outbox_command_app, "app", app)
        apps.append(app)
        return app

    yield use
    for app in apps:
        reset(app)  # closes its relay (there is none when its settings were bad)
        app.close()


def committed_rows(
    app: Celery, count: int, *, created_at: datetime | None = None, prefix: str = "row"
) -> list[str]:
    """Rows as a crash right after COMMIT leaves them: committed, never published."""
    store = DjangoOutboxStore()
    task_ids = [f"{prefix}-{n}" for n in range(count)]
    with transaction.atomic():
        for task_id in task_ids:  # store.add only: no on-commit publish is registered
            store.add(
                build_message(
                    app.tasks[RECORD],
                    (None,),
                    {},
                    task_id=task_id,
                    options={},
                    now=now(),
                    park_after=timedelta(seconds=30),
                    max_bytes=None,
                )
            )
    if created_at is not None:
        OutboxMessage.objects.filter(task_id__in=task_ids).update(created_at=created_at)
    return task_ids


# -- status ------------------------------------------------------------------------------


def test_status_counts_rows_dead_letters_and_the_oldest_pending_age(use_app: Any) -> None:
    app = use_app("memory://", "status-q")
    committed_rows(app, 4, created_at=now() - timedelta(seconds=90))
    OutboxMessage.objects.filter(task_id="row-0").update(available_at=now() - timedelta(seconds=90))
    OutboxMessage.objects.filter(task_id="row-2").update(status=MessageStatus.FAILED.value)
    OutboxMessage.objects.filter(task_id="row-3").update(available_at=now() + LONG_AGO)
    make_letter()
    make_letter(status="discarded")

    report = json.loads(outbox("status", "--json"))["default"]
    text = outbox("status")

    assert {k: report[k] for k in ("pending", "parked", "failed")} == {
        "pending": 2,
        "parked": 1,
        "failed": 1,
    }
    assert 90 <= report["oldest_pending_age_seconds"] < 120
    assert report["last_sweep_age_seconds"] is None
    assert report["dead_letters"] == {"dead": 1, "requeued": 0, "discarded": 1, "completed": 0}
    assert report["completed"] == 0
    assert report["workflows"] == {"running": 0, "succeeded": 0, "failed": 0, "cancelled": 0}
    assert set(report) == {
        "pending",
        "parked",
        "failed",
        "oldest_pending_age_seconds",
        "last_sweep_age_seconds",
        "dead_letters",
        "completed",
        "workflows",
    }
    assert "  pending            2  (due now)\n" in text
    assert "  parked             1  (due later)\n" in text
    assert "oldest pending: waiting 9" in text
    assert "last sweep: never recorded" in text
    assert "completed atomic tasks: 0" in text
    assert "dead letters: dead 1, requeued 0, discarded 1" in text
    assert "workflows: running 0, succeeded 0, failed 0" in text


def test_status_shows_the_last_sweep(use_app: Any) -> None:
    use_app("memory://", "status-sweep-q")
    outbox("sweep")

    report = json.loads(outbox("status", "--json"))["default"]

    assert 0 <= report["last_sweep_age_seconds"] < 30
    assert report["oldest_pending_age_seconds"] is None
    assert "last sweep: 0." in outbox("status")


def test_status_counts_workflows_by_status(use_app: Any) -> None:
    use_app("memory://", "status-workflows-q")
    store = DjangoOutboxStore()
    for n in range(4):
        store.add_workflow_steps(f"root-{n}", name="tests.chain", steps=1, now=now())
    store.workflow_step_done("root-0", now=now())
    store.workflow_failed("root-1", "task-1", now=now())
    report = json.loads(outbox("status", "--json"))["default"]
    assert report["workflows"] == {"running": 2, "succeeded": 1, "failed": 1, "cancelled": 0}
    assert "  workflows: running 2, succeeded 1, failed 1, cancelled 0\n" in outbox("status")


def test_a_row_past_its_publish_attempts_is_failed_and_counted_by_status(use_app: Any) -> None:
    app = use_app(
        f"amqp://guest:guest@127.0.0.1:{free_port()}//",
        "down-q",
        outbox_publish_max_attempts=2,
        outbox_publish_timeout=0.5,
    )
    committed_rows(app, 1, created_at=now() - LONG_AGO)

    first = outbox("sweep")
    OutboxMessage.objects.update(available_at=now())  # skip the backoff wait
    second = outbox("sweep")

    assert "rescheduled 1, failed 0" in first
    assert "rescheduled 0, failed 1" in second
    row = OutboxMessage.objects.get()
    assert (row.status, row.attempts) == (MessageStatus.FAILED.value, 2)
    assert "Error" in row.last_error
    report = json.loads(outbox("status", "--json"))["default"]
    assert report["failed"] == 1


# -- sweep ---------------------------------------------------------------------------------


def test_one_sweep_publishes_rows_left_by_a_crash_and_each_task_runs_once(
    use_app: Any,
    broker_url: str,
    broker_queue: str,
    tmp_path: Path,
    celery_worker_process: Callable[..., WorkerProcess],
) -> None:
    app = use_app(broker_url, broker_queue)
    task_ids = committed_rows(app, 30, created_at=now() - LONG_AGO)

    assert outbox("sweep") == "default: published 30, rescheduled 0, failed 0 in 1 batch(es)\n"
    assert OutboxMessage.objects.count() == 0

    output = tmp_path / "runs.jsonl"
    celery_worker_process(
        "tests.django.worker_app",
        queue=broker_queue,
        env={
            "OUTBOX_TEST_BROKER": broker_url,
            "OUTBOX_TEST_QUEUE": broker_queue,
            "OUTBOX_TEST_OUTPUT": str(output),
            "OUTBOX_DJANGO_DB_URL": database_url(),
        },
    )
    wait_for(lambda: len(runs(output)) >= 30, timeout=60, what="30 runs")
    time.sleep(1.0)  # room for a duplicate to show up
    assert Counter(r["task_id"] for r in runs(output)) == Counter(dict.fromkeys(task_ids, 1))


def test_a_sweep_purges_old_published_rows_as_the_beat_sweep_does(use_app: Any) -> None:
    app = use_app("memory://", "sweep-purge-q", outbox_keep_published=3600)
    old = committed_rows(app, 3, created_at=now() - timedelta(days=2), prefix="old")
    recent = committed_rows(app, 1, created_at=now() - timedelta(minutes=5), prefix="recent")
    OutboxMessage.objects.update(status=MessageStatus.PUBLISHED.value)

    out = outbox("sweep")

    assert "purged 3" in out, out
    assert list(OutboxMessage.objects.values_list("task_id", flat=True)) == recent
    assert not OutboxMessage.objects.filter(task_id__in=old).exists()


def test_a_sweep_purges_completed_tasks_past_outbox_keep_completed(use_app: Any) -> None:
    use_app("memory://", "sweep-completed-q", outbox_keep_completed=3600)
    completed_tasks(3, completed_at=now() - timedelta(days=2), prefix="old")
    completed_tasks(1, completed_at=now() - timedelta(minutes=5), prefix="recent")

    out = outbox("sweep")

    assert out.endswith(", purged 3 completed task(s)\n"), out
    assert list(CompletedTask.objects.values_list("task_id", flat=True)) == ["recent-0"]


# -- relay ---------------------------------------------------------------------------------


def start_relay(broker_url: str, queue: str, *args: str) -> subprocess.Popen[str]:
    env = {
        "DJANGO_SETTINGS_MODULE": "tests.django.outbox_command_settings",
        "OUTBOX_DJANGO_DB_URL": database_url(),
        "OUTBOX_TEST_BROKER": broker_url,
        "OUTBOX_TEST_QUEUE": queue,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "tests.django.outbox_command_main", "outbox", "relay", *args],
        cwd=REPO_ROOT,
        env=worker_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def first_relay_line(stdout: IO[str]) -> str:
    """The relay's first line, after the system checks' output (W002 here: no beat entry)."""
    for _ in range(20):
        line = stdout.readline()
        if line.startswith("outbox relay:") or not line:
            return line
    return ""


@pytest.mark.parametrize("stop_with", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_relay_publishes_within_a_second_and_stops_cleanly_on_a_signal(
    use_app: Any, broker_url: str, broker_queue: str, stop_with: int
) -> None:
    from tests.integration.sweep_support import drain_task_ids

    app = use_app(broker_url, broker_queue)
    relay = start_relay(broker_url, broker_queue, "--poll", "0.1", "--grace", "0")
    try:
        assert relay.stdout is not None
        assert "polling every 0.1 s" in first_relay_line(relay.stdout)
        committed = time.monotonic()
        task_ids = committed_rows(app, 20)
        wait_for(lambda: not OutboxMessage.objects.exists(), timeout=10, what="the relay")
        latency = time.monotonic() - committed
        print(f"\nrelay published 20 rows {latency * 1000:.0f} ms after their commit")
        assert latency < 1.0
    finally:
        relay.send_signal(stop_with)
        out, _ = relay.communicate(timeout=10)
    assert relay.returncode == 0, out
    assert "outbox relay: stopped" in out
    assert drain_task_ids(broker_url, broker_queue) == Counter(dict.fromkeys(task_ids, 1))


# -- purge ---------------------------------------------------------------------------------


def test_purge_deletes_old_rows_of_the_given_status_in_batches(use_app: Any) -> None:
    app = use_app("memory://", "purge-q")
    old = now() - timedelta(days=2)
    committed_rows(app, 5, created_at=old, prefix="old-published")
    committed_rows(app, 2, created_at=old, prefix="old-failed")
    committed_rows(app, 1, prefix="new-published")
    committed_rows(app, 1, created_at=old, prefix="old-pending")
    OutboxMessage.objects.filter(task_id__contains="published").update(
        status=MessageStatus.PUBLISHED.value
    )
    OutboxMessage.objects.filter(task_id__startswith="old-failed").update(
        status=MessageStatus.FAILED.value
    )

    assert (
        outbox("purge", "--older-than", "86400", "--status", "published", "--batch", "2")
        == "default: purged 5 row(s)\n"
    )
    assert outbox("purge", "--older-than", "86400") == "default: purged 2 row(s)\n"
    assert sorted(OutboxMessage.objects.values_list("task_id", flat=True)) == [
        "new-published-0",
        "old-pending-0",
    ]


def completed_tasks(count: int, *, completed_at: datetime, prefix: str) -> None:
    """``count`` CompletedTask rows completed at ``completed_at``, committed."""
    store = DjangoOutboxStore()
    for n in range(count):
        with store.complete_once(f"{prefix}-{n}", "tests.atomic", now=completed_at):
            pass


def test_status_counts_and_purge_deletes_completed_tasks_in_batches(use_app: Any) -> None:
    use_app("memory://", "purge-completed-q")
    completed_tasks(5, completed_at=now() - timedelta(days=2), prefix="old")
    completed_tasks(2, completed_at=now(), prefix="new")
    committed_rows(use_app("memory://", "purge-completed-q"), 1, created_at=now() - LONG_AGO)
    OutboxMessage.objects.update(status=MessageStatus.PUBLISHED.value)
    assert json.loads(outbox("status", "--json"))["default"]["completed"] == 7
    assert "completed atomic tasks: 7" in outbox("status")

    assert outbox("purge", "--completed", "--older-than", "86400", "--batch", "2") == (
        "default: purged 5 completed task(s)\n"
    )
    assert sorted(CompletedTask.objects.values_list("task_id", flat=True)) == ["new-0", "new-1"]
    assert OutboxMessage.objects.count() == 1  # --completed leaves the outbox rows alone
    assert outbox("purge", "--completed", "--older-than", "0") == (
        "default: purged 2 completed task(s)\n"
    )
    assert json.loads(outbox("status", "--json"))["default"]["completed"] == 0


# -- errors --------------------------------------------------------------------------------


def test_errors_become_command_errors(settings: Any) -> None:
    settings.DJANGO_OUTBOX_CELERY_APP = "tests.no_such_module:app"
    with pytest.raises(CommandError, match="DJANGO_OUTBOX_CELERY_APP"):
        outbox("status")


def test_a_bad_setting_is_a_command_error(use_app: Any) -> None:
    use_app("memory://", "bad-q", outbox_sweep_batch_size=0)
    with pytest.raises(CommandError, match="outbox_sweep_batch_size"):
        outbox("sweep")


def test_each_subcommand_is_a_module_of_its_own() -> None:
    assert {"status", "sweep", "relay", "purge"} <= set(subcommands())
