"""Django settings of the benchmark processes (the harness and its workers).

The database is ``BENCH_POSTGRES_URL`` (default: a ``celery_outbox_bench`` database on the
loopback PostgreSQL); the harness creates and migrates it.
"""

from __future__ import annotations

import os
from importlib.util import find_spec
from urllib.parse import urlsplit

#: The benchmark database (created by the harness when missing).
POSTGRES_URL = os.environ.get(
    "BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/celery_outbox_bench"
)

#: The database of django-celery-outbox's rows (same server).
PEER_DATABASE = os.environ.get("BENCH_PEER_DB", "celery_outbox_bench_peer")

_url = urlsplit(POSTGRES_URL)

SECRET_KEY = "celery-outbox-benchmarks-only"  # a benchmark-only key, never deployed
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    # The admin, for the admin_pages benchmark.
    "django.contrib.admin",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_outbox",
]
if find_spec("django.tasks") and find_spec("django_tasks_db"):
    # django-tasks-db (pip install django-tasks-db), Django's task framework's ORM backend,
    # when installed: the django_tasks benchmark compares its enqueue() with ours.
    INSTALLED_APPS.append("django_tasks_db")
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _url.path.lstrip("/"),
        "USER": _url.username or "postgres",
        "PASSWORD": _url.password or "",
        "HOST": _url.hostname or "127.0.0.1",
        "PORT": str(_url.port or 5432),
        # Keep one connection per process, as a web worker or a Celery worker would.
        "CONN_MAX_AGE": None,
    },
}
LOGGING_CONFIG = None
# The admin, rendered through Django's test client by the admin_pages benchmark.
ROOT_URLCONF = "benchmarks.urls"
ALLOWED_HOSTS = ["testserver", "localhost"]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]
DJANGO_OUTBOX_CELERY_APP = "benchmarks.app:app"
