"""Settings of the demo shop. Everything that differs between machines comes from the environment.

- ``DATABASE_URL``: the database, such as ``postgresql://user:pw@host:5432/name``
  (default: a SQLite file in ``SHOP_VAR_DIR``).
- ``CELERY_BROKER_URL``: the broker, such as ``redis://localhost:6379/0`` or
  ``amqp://guest:guest@localhost:5672//`` (default: Kombu's filesystem transport in
  ``SHOP_VAR_DIR/broker``).
- ``CELERY_OUTBOX_<NAME>``: any celery-outbox setting, as JSON (``2.5``, ``true``,
  ``null``); default: the library's defaults, except ``CELERY_OUTBOX_KEEP_PUBLISHED``.
- ``SHOP_VAR_DIR``: where the SQLite file and the broker folder live
  (default ``example_project/var``).
- ``SHOP_FAILURE_RATES``: chance that one send fails, per channel (and for the
  fulfilment's carrier; default ``push=0.3,sms=0.2,messenger=0.1,carrier=0.2``).
- ``SHOP_PROVIDER_LATENCY``: seconds one send takes (default ``0.02``).
- ``SHOP_OUTAGE_DIR``: a channel is down while ``<dir>/<channel>.down`` exists
  (default ``SHOP_VAR_DIR/outages``).
- ``SHOP_PROVIDER_SEED``: which attempts fail (same seed, same failures).
- ``SHOP_RETRY_BACKOFF``, ``SHOP_MAX_RETRIES``: ``retry_backoff`` (default ``1.0``) and
  ``max_retries`` (default ``4``) of the notification tasks.
- ``SHOP_FULFILMENT_MAX_RETRIES``: ``max_retries`` of the fulfilment steps (default ``20``:
  enough to outlast a carrier outage of the demo; their waits are capped at 2 s).

Nothing here needs a server: by default the shop runs on SQLite and a broker made of
files. Point ``DATABASE_URL`` and ``CELERY_BROKER_URL`` at PostgreSQL and Redis or
RabbitMQ to run the same code against real services.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from celery_outbox.config import DEFAULTS
from shop_project.broker import transport_options
from shop_project.databases import database_from_url

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("SHOP_VAR_DIR") or BASE_DIR / "var").resolve()

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "demo-only-not-a-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "[::1]", "testserver"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_outbox",
    "shop",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "shop_project.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
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
WSGI_APPLICATION = "shop_project.wsgi.application"

DATABASES = {
    "default": database_from_url(
        os.environ.get("DATABASE_URL") or f"sqlite:///{VAR_DIR / 'shop.sqlite3'}"
    ),
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # SQLite has no SKIP LOCKED: run one beat (one sweeper) for it, as the demo does.
    SILENCED_SYSTEM_CHECKS = ["django_outbox.W003"]

USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"
STATIC_URL = "static/"

# --- Celery -------------------------------------------------------------------------------
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL") or "filesystem://"
if CELERY_BROKER_URL.startswith("filesystem://"):
    CELERY_BROKER_TRANSPORT = "shop_project.broker:Transport"
    CELERY_BROKER_TRANSPORT_OPTIONS = transport_options(VAR_DIR / "broker")
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_IGNORE_RESULT = True  # the shop records deliveries in its own table
CELERY_TIMEZONE = "UTC"
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")

# --- celery-outbox --------------------------------------------------------------------------
# Keep published rows for a day so the demo can measure publish latency from the table.
CELERY_OUTBOX_KEEP_PUBLISHED = 86400.0
# Every outbox setting may come from the environment, as JSON: CELERY_OUTBOX_PARK_AFTER=2.
for _name in DEFAULTS:
    _value = os.environ.get(f"CELERY_{_name.upper()}")
    if _value is not None:
        globals()[f"CELERY_{_name.upper()}"] = json.loads(_value)

# --- the fake notification provider ---------------------------------------------------------
SHOP_PROVIDER = {
    "failure_rates": os.environ.get(
        "SHOP_FAILURE_RATES", "push=0.3,sms=0.2,messenger=0.1,carrier=0.2"
    ),
    "latency": float(os.environ.get("SHOP_PROVIDER_LATENCY", "0.02")),
    "outage_dir": os.environ.get("SHOP_OUTAGE_DIR") or str(VAR_DIR / "outages"),
    "seed": os.environ.get("SHOP_PROVIDER_SEED", "celery-outbox"),
}
SHOP_RETRY_BACKOFF = float(os.environ.get("SHOP_RETRY_BACKOFF", "1.0"))
SHOP_MAX_RETRIES = int(os.environ.get("SHOP_MAX_RETRIES", "4"))
SHOP_FULFILMENT_MAX_RETRIES = int(os.environ.get("SHOP_FULFILMENT_MAX_RETRIES", "20"))

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("SHOP_LOG_LEVEL", "WARNING")},
}
