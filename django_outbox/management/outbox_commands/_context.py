"""What every subcommand needs: the Celery app (its tasks loaded), its store and settings."""

from __future__ import annotations

from argparse import ArgumentParser
from dataclasses import dataclass

from celery import Celery
from django.conf import settings as django_settings
from django.core.management.base import CommandError
from django.db import DEFAULT_DB_ALIAS

from celery_outbox.config import OutboxConfig
from celery_outbox.exceptions import OutboxConfigError
from celery_outbox.registry import store_for
from celery_outbox.relay.relay import relay_for
from celery_outbox.relay.sweeper import Sweeper
from celery_outbox.store.base import OutboxStore
from django_outbox.celery_app import outbox_app


@dataclass(frozen=True, kw_only=True)
class OutboxContext:
    """The app, store, settings and database aliases a subcommand works on."""

    app: Celery
    store: OutboxStore
    config: OutboxConfig
    aliases: tuple[str | None, ...]

    def sweeper(self) -> Sweeper:
        """A sweeper publishing through the app's relay."""
        return Sweeper(
            app=self.app, store=self.store, relay=relay_for(self.app), config=self.config
        )


def load_context(database: str | None) -> OutboxContext:
    """The context of ``database`` (or of every alias the store sweeps).

    Raises
    ------
    CommandError
        ``database`` is not an alias of ``DATABASES``.
    """
    if database is not None and database not in django_settings.DATABASES:
        raise CommandError(
            f"--database {database!r} is not accepted: give one of the aliases in "
            f"DATABASES {sorted(django_settings.DATABASES)}."
        )
    app = celery_app()
    store = store_for(app)
    aliases = (database,) if database else tuple(store.sweep_aliases())
    return OutboxContext(
        app=app, store=store, config=OutboxConfig.from_celery(app), aliases=aliases
    )


def celery_app() -> Celery:
    """``DJANGO_OUTBOX_CELERY_APP`` or the project's app, with its task modules imported.

    Raises
    ------
    CommandError
        When the setting cannot be imported, or no Celery app was created.
    """
    try:
        return outbox_app()
    except OutboxConfigError as exc:
        raise CommandError(str(exc)) from exc


def add_database_argument(parser: ArgumentParser) -> None:
    """``--database ALIAS``: one alias instead of every alias in DJANGO_OUTBOX_DATABASES."""
    parser.add_argument(
        "--database",
        default=None,
        help="one database alias (default: each of DJANGO_OUTBOX_DATABASES)",
    )


def alias_name(alias: str | None) -> str:
    """How ``alias`` is printed (``None`` is the default database)."""
    return alias or DEFAULT_DB_ALIAS
