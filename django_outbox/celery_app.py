"""Which Celery app the Django surfaces (admin, ``manage.py outbox``) act through."""

from __future__ import annotations

from celery import Celery
from kombu.utils.imports import symbol_by_name

from celery_outbox.exceptions import OutboxConfigError
from django_outbox._compat import created_celery_app
from django_outbox.settings import settings


def outbox_app() -> Celery:
    """The Celery app the admin and commands act through, with its task modules imported.

    ``DJANGO_OUTBOX_CELERY_APP`` (a dotted path) when set, else the app the project
    created (Celery's current app). The task modules are imported as a worker imports
    them: in a web process ``autodiscover_tasks`` has not run yet, so a letter's task
    would look unregistered.

    Raises
    ------
    OutboxConfigError
        The setting cannot be imported, or the project never created a Celery app.
    """
    app = project_app()
    app.loader.import_default_modules()
    return app


def project_app() -> Celery:
    """``DJANGO_OUTBOX_CELERY_APP`` when set, else the app the project created (its task
    modules not imported: what the system checks read the configuration of).

    Raises
    ------
    OutboxConfigError
        The setting cannot be imported, or the project never created a Celery app.
    """
    return _configured_app(settings.CELERY_APP)


def import_app(path: str) -> Celery:
    """The Celery app at dotted ``path`` (``DJANGO_OUTBOX_CELERY_APP``).

    Raises
    ------
    OutboxConfigError
        When ``path`` cannot be imported or is not a Celery app.
    """
    try:
        app = symbol_by_name(path)
    except (ImportError, AttributeError, ValueError, TypeError) as exc:
        raise OutboxConfigError(
            f"DJANGO_OUTBOX_CELERY_APP={path!r} cannot be imported ({exc}): give the "
            "dotted path of your Celery app, e.g. 'proj.celery:app'."
        ) from exc
    if not isinstance(app, Celery):
        raise OutboxConfigError(
            f"DJANGO_OUTBOX_CELERY_APP={path!r} is a {type(app).__name__}, not a Celery app: "
            "give the dotted path of your Celery app, e.g. 'proj.celery:app'."
        )
    return app


def _configured_app(path: str | None) -> Celery:
    if path:
        return import_app(path)
    # Not get_current_app(): with no app at all it makes an empty fallback app. (Nor a
    # check against ``default_app``: Celery's Django fixup makes the project's app the
    # default app as soon as it is created.)
    created = created_celery_app()
    if created is None or _is_fallback(created):
        raise OutboxConfigError(
            "No Celery app found: import it in your project's __init__.py (as Celery's "
            "Django guide does) or set DJANGO_OUTBOX_CELERY_APP."
        )
    return created


def _is_fallback(app: Celery) -> bool:
    """Whether ``app`` is the empty app Celery makes when asked for one before any exists."""
    return app.main == "default" and not getattr(app, "fixups", None)
