"""Django settings for the test suite (pytest-django).

The databases are PostgreSQL from ``OUTBOX_TEST_POSTGRES_URL``; the tests run on copies named
``test_<name>_<run id>``. ``OUTBOX_TEST_DJANGO_DB=sqlite`` switches both aliases to SQLite.
``other`` is a second database for multi-database tests.
"""

from __future__ import annotations

import importlib.util
import os
import uuid
from typing import Any

from tests.services import SERVICES, parse_db_url

#: ``postgres`` (default) or ``sqlite``.
DJANGO_DB = os.environ.get("OUTBOX_TEST_DJANGO_DB", "postgres").lower()

#: Keeps this run's test databases apart from a concurrent run's on the same server (two
#: sessions sharing ``test_test`` drop it under each other). Exported, so subprocesses agree;
#: set it yourself (e.g. ``OUTBOX_TEST_RUN_ID=dev``) for stable names with ``--reuse-db``.
RUN_ID = os.environ.setdefault("OUTBOX_TEST_RUN_ID", uuid.uuid4().hex[:8])


def postgres_database(url: str, *, suffix: str = "") -> dict[str, Any]:
    """A Django ``DATABASES`` entry for the PostgreSQL database of ``url`` (plus ``suffix``)."""
    params = parse_db_url(url)
    name = f"{params.name}{suffix}"
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "TEST": {"NAME": f"test_{name}_{RUN_ID}"},
        "USER": params.user,
        "PASSWORD": params.password,
        "HOST": params.host,
        "PORT": str(params.port or ""),
        "OPTIONS": {"connect_timeout": 5},
    }


def sqlite_database(name: str) -> dict[str, Any]:
    """A Django ``DATABASES`` entry for SQLite (tests run on in-memory copies)."""
    return {"ENGINE": "django.db.backends.sqlite3", "NAME": name}


def databases() -> dict[str, dict[str, Any]]:
    """``default`` and ``other`` for the database ``OUTBOX_TEST_DJANGO_DB`` chooses."""
    if DJANGO_DB == "sqlite":
        return {"default": sqlite_database("outbox"), "other": sqlite_database("outbox_other")}
    if DJANGO_DB != "postgres":
        raise ValueError(f"OUTBOX_TEST_DJANGO_DB={DJANGO_DB!r}: use 'postgres' or 'sqlite'")
    url = SERVICES["postgres"].url
    return {"default": postgres_database(url), "other": postgres_database(url, suffix="_other")}


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


SECRET_KEY = "celery-outbox-tests-only"  # a test suite's key, never deployed
DEBUG = False
ALLOWED_HOSTS = ["testserver", "localhost", "127.0.0.1"]
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
ROOT_URLCONF = "tests.django_urls"
DATABASES = databases()
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast, tests only

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    # Until django_outbox has its AppConfig the suite still configures Django without it.
    *(["django_outbox"] if _has_module("django_outbox.apps") else []),
]

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

#: Celery settings for a Django-configured app (``config_from_object(..., namespace="CELERY")``).
CELERY_BROKER_URL = "memory://"
CELERY_TASK_ALWAYS_EAGER = False
