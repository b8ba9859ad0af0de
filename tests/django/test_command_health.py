"""``manage.py outbox health`` on real PostgreSQL: exit codes, one line per reason, the
limits' defaults and bad values, and a database that cannot be reached (a subprocess,
as a Kubernetes probe runs it).
"""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery
from django.core.management import call_command
from django.core.management.base import CommandError

from celery_outbox.state import reset
from celery_outbox.store.base import SWEEP_NAME
from celery_outbox.store.records import MessageStatus
from django_outbox.models import OutboxMessage, SweepRecord
from django_outbox.store import DjangoOutboxStore
from tests.django import outbox_command_app
from tests.django.celery_app import create_app
from tests.django.helpers import database_url
from tests.django.outbox_command_app import APP_PATH
from tests.services import free_port
from tests.worker import REPO_ROOT, worker_env

pytestmark = pytest.mark.django_db(transaction=True)

HOUR = timedelta(hours=1)


def now() -> datetime:
    return datetime.now(timezone.utc)


def health(*args: str) -> tuple[int, str, str]:
    """Run ``manage.py outbox health *args``: exit status, standard output and error."""
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("outbox", "health", *args, stdout=out, stderr=err)
    except SystemExit as exc:
        return int(exc.code or 0), out.getvalue(), err.getvalue()
    return 0, out.getvalue(), err.getvalue()


@pytest.fixture
def app(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Celery]:
    settings.DJANGO_OUTBOX_CELERY_APP = APP_PATH
    app = create_app("memory://", "health-q", outbox_beat_schedule=False, outbox_sweep_interval=5.0)
    monkeypatch.setattr(outbox_command_app, "app", app)
    yield app
    reset(app)
    app.close()


def swept(ago: timedelta = timedelta(0)) -> None:
    """The sweep record, as a sweep ``ago`` left it."""
    DjangoOutboxStore().record_sweep(every=timedelta(0))
    SweepRecord.objects.filter(name=SWEEP_NAME).update(last_sweep_at=now() - ago)


def row(task_id: str, *, due: datetime, status: MessageStatus = MessageStatus.PENDING) -> None:
    OutboxMessage.objects.create(
        task_id=task_id,
        task_name="tests.record",
        payload="[[], {}, {}]",
        options={},
        status=status.value,
        available_at=due,
    )


def test_healthy_after_a_sweep_exits_0(app: Celery) -> None:
    call_command("outbox", "sweep", stdout=io.StringIO())
    row("fresh", due=now())
    row("parked", due=now() + HOUR)

    assert health() == (0, "healthy: default\n", "")


def test_no_sweep_yet_is_unhealthy(app: Celery) -> None:
    code, out, err = health()
    assert (code, out) == (1, "")
    assert err == (
        "database default: no sweep has run yet: is celery beat (or `outbox relay`) running?\n"
    )


def test_an_old_due_row_is_unhealthy_past_max_pending_age(app: Celery) -> None:
    swept()
    row("stuck", due=now() - timedelta(minutes=2))

    code, _, err = health("--max-pending-age", "60")

    assert code == 1
    assert err.startswith("database default: the oldest due outbox row has waited 12")
    assert "longer than max pending age 60.0 s" in err
    assert health("--max-pending-age", "600")[0] == 0


def test_the_last_sweep_older_than_max_sweep_age_is_unhealthy(app: Celery) -> None:
    swept(ago=timedelta(seconds=40))

    code, _, err = health()  # default: three intervals of 5 s

    assert code == 1
    assert "the last sweep ran 40." in err
    assert "longer than max sweep age 15.0 s" in err
    assert health("--max-sweep-age", "60")[0] == 0


def test_failed_rows_are_unhealthy_with_fail_on_failed(app: Celery) -> None:
    swept()
    row("gave-up", due=now() - HOUR, status=MessageStatus.FAILED)

    assert health()[0] == 0
    code, _, err = health("--fail-on-failed")
    assert code == 1
    assert (
        err == "database default: 1 failed outbox row(s): publishing gave up (read "
        "last_error, fix, then reset them)\n"
    )


def test_every_reason_is_one_line(app: Celery) -> None:
    swept(ago=HOUR)
    row("stuck", due=now() - HOUR)
    row("gave-up", due=now() - HOUR, status=MessageStatus.FAILED)

    code, _, err = health("--fail-on-failed")

    assert code == 1
    assert len(err.splitlines()) == 3


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--max-pending-age", "-1"),
        ("--max-pending-age", "0"),
        ("--max-sweep-age", "soon"),
        ("--max-sweep-age", "nan"),
        ("--max-sweep-age", "1e9"),
    ],
)
def test_a_bad_limit_is_an_error_naming_the_value(app: Celery, option: str, value: str) -> None:
    with pytest.raises(CommandError, match=rf"{option}: '{value}' is not accepted: give 0.001 to"):
        health(option, value)


def run_probe(db_url: str) -> subprocess.CompletedProcess[str]:
    """``manage.py outbox health`` in a process of its own, as a probe runs it."""
    env = {
        "DJANGO_SETTINGS_MODULE": "tests.django.outbox_command_settings",
        "OUTBOX_DJANGO_DB_URL": db_url,
        "OUTBOX_TEST_BROKER": "memory://",
        "OUTBOX_TEST_QUEUE": "health-probe-q",
    }
    return subprocess.run(
        [sys.executable, "-m", "tests.django.outbox_command_main", "outbox", "health"],
        cwd=REPO_ROOT,
        env=worker_env(env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_probe_process_exits_0_when_healthy(app: Celery) -> None:
    swept()
    probe = run_probe(database_url())
    assert (probe.returncode, probe.stdout) == (0, "healthy: default\n"), probe.stderr


def test_an_unreachable_database_is_a_reason_never_a_traceback() -> None:
    probe = run_probe(f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere")

    assert probe.returncode == 1
    assert "Traceback" not in probe.stderr
    lines = probe.stderr.splitlines()
    assert len(lines) == 1, probe.stderr
    assert lines[0].startswith("database default: cannot read the outbox: celery-outbox could not")
