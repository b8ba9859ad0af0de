"""``celery -A proj outbox status|health|sweep``: the outbox's command on any store.

Registered through Celery's ``celery.commands`` entry point (Celery's click CLI), so it
works on whatever store ``proj``'s app has installed (the SQLAlchemy store needs no Django;
a Django project's app loads Django as its worker does). The work is the same functions
``manage.py outbox`` runs (:mod:`celery_outbox.console`).

Exit codes: 0 done (``health``: healthy); 1 ``health`` found the outbox unhealthy; 2 the
command could not do its work (no store installed, a database that cannot be read, a bad
value), with one clear line on standard error and no traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any, NoReturn

import click
from celery import Celery

from celery_outbox.config import SHORTEST, OutboxConfig, Seconds
from celery_outbox.console import status as status_report
from celery_outbox.console import sweep as sweep_pass
from celery_outbox.exceptions import NoStoreConfigured, OutboxError
from celery_outbox.health import check
from celery_outbox.registry import store_for
from celery_outbox.relay.relay import relay_for
from celery_outbox.relay.sweeper import Sweeper
from celery_outbox.store.base import OutboxStore

#: Exit status when the command could not do its work.
FAILED = 2

#: Accepted ``--max-pending-age`` and ``--max-sweep-age``: up to a week.
AGE = Seconds(minimum=SHORTEST, maximum=7 * 24 * 3600.0)

#: What to do when no store is installed.
NO_STORE = (
    "no outbox store is installed on this app: set outbox_store to a store's dotted path "
    "(CELERY_OUTBOX_STORE in Django, where adding django_outbox to INSTALLED_APPS installs "
    "it), or call celery_outbox.registry.install_store(app, SQLAlchemyOutboxStore(...)) in "
    "the app's module (docs/sqlalchemy.md)."
)


class AgeType(click.ParamType):  # type: ignore[type-arg]  # generic from click 8.2 only
    """A number of seconds that :data:`AGE` accepts; anything else is refused, named."""

    name = "seconds"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            seconds = float("nan")
        if not AGE.accepts(seconds):
            self.fail(f"{value!r} is not accepted: give {AGE.accepted}.", param, ctx)
        return seconds


def _fail(message: str) -> NoReturn:
    click.echo(f"outbox: {message}", err=True)
    sys.exit(FAILED)


def _app(ctx: click.Context) -> Celery:
    """The ``-A`` app, its task modules imported as a worker imports them."""
    app: Celery = ctx.obj.app
    app.loader.import_default_modules()
    return app


def _store(app: Celery) -> OutboxStore:
    try:
        return store_for(app)
    except NoStoreConfigured:
        _fail(NO_STORE)
    except OutboxError as exc:
        _fail(str(exc))


def _finish(command: str, failed: list[str]) -> None:
    if failed:
        _fail(f"{command}: " + "\n".join(failed))


@click.group(name="outbox")
@click.pass_context
def outbox(ctx: click.Context) -> None:
    """Inspect and operate the celery-outbox of this app (any store)."""


@outbox.command(help=status_report.HELP)
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    store = _store(_app(ctx))
    failed = status_report.report(store, store.sweep_aliases(), as_json=as_json, write=click.echo)
    _finish("status", failed)


@outbox.command(help=sweep_pass.HELP)
@click.pass_context
def sweep(ctx: click.Context) -> None:
    app = _app(ctx)
    store = _store(app)
    sweeper = Sweeper(
        app=app, store=store, relay=relay_for(app), config=OutboxConfig.from_celery(app)
    )
    failed = sweep_pass.sweep(sweeper, store.sweep_aliases(), write=click.echo)
    _finish("sweep", failed)


@outbox.command(help="Exit 0 when the outbox is healthy, 1 with one line per reason (a probe).")
@click.option(
    "--max-pending-age",
    type=AgeType(),
    default=None,
    help="longest a due row may wait (default: outbox_publish_grace + 3 sweep intervals)",
)
@click.option(
    "--max-sweep-age",
    type=AgeType(),
    default=None,
    help="longest since the last sweep (default: 3 outbox_sweep_interval)",
)
@click.option("--fail-on-failed", is_flag=True, help="unhealthy while any row is failed")
@click.pass_context
def health(
    ctx: click.Context,
    max_pending_age: float | None,
    max_sweep_age: float | None,
    fail_on_failed: bool,
) -> None:
    app = _app(ctx)
    store = _store(app)
    aliases = store.sweep_aliases()
    reasons = check(
        app,
        max_pending_age=_age(max_pending_age),
        max_sweep_age=_age(max_sweep_age),
        fail_on_failed=fail_on_failed,
        aliases=aliases,
    )
    if not reasons:
        click.echo("healthy: " + ", ".join(status_report.alias_name(a) for a in aliases))
        return
    for reason in reasons:
        click.echo(reason, err=True)
    sys.exit(1)


def _age(value: float | None) -> timedelta | None:
    return None if value is None else AGE.convert(value)


#: The subcommands, by name (the docs list them from here).
SUBCOMMANDS: dict[str, Callable[..., Any]] = {"status": status, "health": health, "sweep": sweep}
