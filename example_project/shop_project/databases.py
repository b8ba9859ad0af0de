"""``DATABASE_URL`` to a Django ``DATABASES`` entry (SQLite, PostgreSQL, MySQL/MariaDB)."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import django

#: URL schemes and the Django backend each one selects.
ENGINES = {
    "sqlite": "django.db.backends.sqlite3",
    "postgres": "django.db.backends.postgresql",
    "postgresql": "django.db.backends.postgresql",
    "mysql": "django.db.backends.mysql",
    "mariadb": "django.db.backends.mysql",
}

#: SQLite options so that several processes (web, worker, beat, demo) share one file:
#: WAL lets readers run beside the writer, the busy timeout makes a writer wait for the
#: lock instead of failing with "database is locked", and IMMEDIATE transactions take
#: the write lock at BEGIN, so no transaction fails when it upgrades from read to write
#: (Django 5.1+; before, only the busy timeout applies).
SQLITE_OPTIONS: dict[str, Any] = {"timeout": 30}
if django.VERSION >= (5, 1):
    SQLITE_OPTIONS.update(
        {
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            "transaction_mode": "IMMEDIATE",
        }
    )


def database_from_url(url: str) -> dict[str, Any]:
    """The ``DATABASES["default"]`` entry for ``url``.

    ``sqlite:////absolute/path.sqlite3`` (or ``sqlite:///relative.sqlite3``),
    ``postgresql://user:password@host:5432/name?sslmode=require``,
    ``mysql://user:password@host:3306/name``; query parameters become ``OPTIONS``.

    Raises
    ------
    ValueError
        For a scheme that is not one of :data:`ENGINES`.
    """
    parts = urlsplit(url)
    engine = ENGINES.get(parts.scheme)
    if engine is None:
        raise ValueError(f"DATABASE_URL={url!r}: give one of the schemes {sorted(ENGINES)}.")
    if parts.scheme == "sqlite":
        name = url.split(":///", 1)[1] if ":///" in url else ":memory:"
        if name != ":memory:":
            Path(name).parent.mkdir(parents=True, exist_ok=True)
        return {"ENGINE": engine, "NAME": name, "OPTIONS": dict(SQLITE_OPTIONS)}
    return {
        "ENGINE": engine,
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
        "OPTIONS": dict(parse_qsl(parts.query)),
    }
