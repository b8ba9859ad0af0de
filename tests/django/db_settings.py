"""Django settings for processes the Django tests start: workers and dispatch clients.

The databases come from the environment, so a subprocess uses the very database the test
prepared: ``OUTBOX_DJANGO_DB_URL`` (alias ``default``) and, optionally,
``OUTBOX_DJANGO_OTHER_DB_URL`` (alias ``other``). URLs are ``postgresql://``,
``mysql://`` (through PyMySQL) or ``sqlite:///path``. ``OUTBOX_DJANGO_DB_OPTIONS`` (JSON)
adds to the ``OPTIONS`` of ``default`` (e.g. ``{"isolation_level": "repeatable read"}``).
"""

from __future__ import annotations

import json
import os
from typing import Any

from tests.services import parse_db_url

#: Django's engine for each URL scheme.
ENGINES = {
    "postgresql": "django.db.backends.postgresql",
    "postgres": "django.db.backends.postgresql",
    "mysql": "django.db.backends.mysql",
    "sqlite": "django.db.backends.sqlite3",
}


def use_pymysql() -> None:
    """Let Django's MySQL backend run on PyMySQL (it asks for mysqlclient >= 2.2.1)."""
    import pymysql

    pymysql.version_info = (2, 2, 1, "final", 0)
    pymysql.install_as_MySQLdb()


def database(url: str) -> dict[str, Any]:
    """A ``DATABASES`` entry for ``url``."""
    if url.startswith("sqlite:///"):
        return {
            "ENGINE": ENGINES["sqlite"],
            "NAME": url.removeprefix("sqlite:///"),
            "OPTIONS": {"timeout": 30},
        }
    params = parse_db_url(url)
    if params.scheme == "mysql":
        use_pymysql()
    entry: dict[str, Any] = {
        "ENGINE": ENGINES[params.scheme],
        "NAME": params.name,
        "USER": params.user,
        "PASSWORD": params.password,
        "HOST": params.host,
        "PORT": params.port or "",
    }
    if params.scheme == "mysql":
        entry["OPTIONS"] = {"charset": "utf8mb4"}
    return entry


SECRET_KEY = "django-outbox-tests"
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_outbox"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DATABASES = {"default": database(os.environ.get("OUTBOX_DJANGO_DB_URL", "sqlite:///:memory:"))}
DATABASES["default"].setdefault("OPTIONS", {}).update(
    json.loads(os.environ.get("OUTBOX_DJANGO_DB_OPTIONS", "{}"))
)
if os.environ.get("OUTBOX_DJANGO_OTHER_DB_URL"):
    DATABASES["other"] = database(os.environ["OUTBOX_DJANGO_OTHER_DB_URL"])
