"""``django_outbox.tasks`` imports on every Django: Celery's ``autodiscover_tasks`` imports
``<app>.tasks`` of each installed app, and an ``ImportError`` there would stop the worker.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

from celery.loaders.base import find_related_module

from tests.worker import REPO_ROOT, worker_env

HAS_DJANGO_TASKS = importlib.util.find_spec("django.tasks") is not None


def test_celery_autodiscovery_imports_django_outbox_tasks_on_any_django() -> None:
    module = find_related_module("django_outbox", "tasks")
    assert module is not None
    expected = ["DurableTask", "OutboxBackend", "task"] if HAS_DJANGO_TASKS else []
    assert sorted(module.__all__) == expected


def test_importing_django_outbox_imports_nothing_of_django_tasks() -> None:
    code = (
        "import django; from django.conf import settings; settings.configure("
        "INSTALLED_APPS=['django.contrib.contenttypes', 'django.contrib.auth', "
        "'django_outbox'], DATABASES={}); django.setup(); import sys; "
        "import django_outbox.checks, django_outbox.store, django_outbox.celery_app; "
        "print(sorted(m for m in sys.modules if m.startswith('django.tasks')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=worker_env({}),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
