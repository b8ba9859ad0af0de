"""The metrics view (``django_outbox.urls``, ``metrics/``) through Django's test client on
real PostgreSQL: who may read it, and the gauges after real dispatches and dead letters.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from tests.django.admin_app import APP_PATH, dispatch_row, make_letter
from tests.worker import REPO_ROOT

pytest.importorskip("prometheus_client")

pytestmark = pytest.mark.django_db

URL = reverse("django_outbox:metrics")
TOKEN = "s3cret-scrape-token"


@pytest.fixture(autouse=True)
def _outbox_app(settings: Any) -> None:
    settings.DJANGO_OUTBOX_CELERY_APP = APP_PATH


def user(name: str, *, staff: bool, view: bool) -> User:
    made: User = User.objects.create_user(name, password="pw", is_staff=staff)
    if view:
        made.user_permissions.add(Permission.objects.get(codename="view_outboxmessage"))
    return made


def get(client: Client | None = None, **headers: str) -> Any:
    return (client or Client()).get(URL, headers=headers)


def logged_in(name: str, *, staff: bool, view: bool) -> Client:
    client = Client()
    client.force_login(user(name, staff=staff, view=view))
    return client


def sample(text: str, name: str) -> float:
    """The value of the sample line ``name`` (with its labels) in the page."""
    lines = [line for line in text.splitlines() if line.startswith(name + " ")]
    assert len(lines) == 1, (name, lines)
    return float(lines[0].rsplit(" ", 1)[1])


def test_nobody_reads_it_by_default() -> None:
    response = get()

    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert b"celery_outbox" not in response.content


def test_without_a_configured_token_no_bearer_opens_it() -> None:
    assert get(Authorization="Bearer ").status_code == 401
    assert get(Authorization="Bearer None").status_code == 401


@pytest.mark.parametrize(("staff", "view"), [(False, False), (True, False), (False, True)])
def test_a_user_without_staff_and_the_permission_is_forbidden(staff: bool, view: bool) -> None:
    response = get(logged_in("someone", staff=staff, view=view))

    assert response.status_code == 403
    assert b"celery_outbox" not in response.content


def test_a_staff_user_with_the_view_permission_reads_the_gauges() -> None:
    dispatch_row()
    dispatch_row()
    dispatch_row(countdown=3600)
    make_letter()
    make_letter(status="discarded")

    response = get(logged_in("ops", staff=True, view=True))

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    text = response.content.decode()
    assert sample(text, "celery_outbox_pending") == 2.0
    assert sample(text, "celery_outbox_parked") == 1.0
    assert sample(text, "celery_outbox_failed") == 0.0
    assert sample(text, 'celery_outbox_dead_letters{status="dead"}') == 1.0
    assert sample(text, 'celery_outbox_dead_letters{status="discarded"}') == 1.0
    assert sample(text, "celery_outbox_scrape_error") == 0.0
    # the in-process counters are served alongside (the default registry)
    assert "# TYPE celery_outbox_published_total counter" in text


def test_the_bearer_token_opens_it(settings: Any) -> None:
    settings.DJANGO_OUTBOX_METRICS_TOKEN = TOKEN

    assert get(Authorization=f"Bearer {TOKEN}").status_code == 200
    assert get(Authorization=f"bearer {TOKEN}").status_code == 200


@pytest.mark.parametrize(
    "header", [f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", TOKEN, f"Basic {TOKEN}", "Bearer é"]
)
def test_a_wrong_token_is_refused(settings: Any, header: str) -> None:
    settings.DJANGO_OUTBOX_METRICS_TOKEN = TOKEN

    assert get(Authorization=header).status_code == 401


COUNT_IN_ANOTHER_PROCESS = """
import celery_outbox.metrics
from celery_outbox import signals

class Task:
    name = "proj.mail"

for _ in range(3):
    signals.task_dead_lettered.send(sender=Task(), letter_id=1, task_id="t", exception=None)
"""


def test_with_a_multiprocess_directory_it_serves_every_processs_counters(
    settings: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    settings.DJANGO_OUTBOX_METRICS_TOKEN = TOKEN
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", COUNT_IN_ANOTHER_PROCESS],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))

    response = get(Authorization=f"Bearer {TOKEN}")

    text = response.content.decode()
    assert sample(text, 'celery_outbox_dead_lettered_total{task="proj.mail"}') == 3.0
    assert sample(text, "celery_outbox_scrape_error") == 0.0
