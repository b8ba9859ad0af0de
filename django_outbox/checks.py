"""System checks for configurations celery-outbox cannot work with safely.

======================  =========================================================
id                      problem
======================  =========================================================
``django_outbox.E001``  an ``outbox_*`` Celery setting has a value it does not accept
``django_outbox.E002``  ``DJANGO_OUTBOX_DATABASES`` is not a list of known aliases
``django_outbox.E003``  ``USE_TZ = False`` (the outbox stores aware UTC datetimes)
``django_outbox.E004``  ``outbox_store`` cannot be imported or gives no ``OutboxStore``
``django_outbox.E005``  ``DJANGO_OUTBOX_CELERY_APP`` cannot be imported as a Celery app
``django_outbox.E006``  workers refuse the ``task_serializer`` (every dispatch would fail)
``django_outbox.W001``  the pickle serializer is enabled
``django_outbox.W002``  the sweep runs on no beat schedule
``django_outbox.W003``  a database without ``SKIP LOCKED``: one sweeper at a time
======================  =========================================================
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from celery import Celery
from django.conf import settings as django_settings
from django.core.checks import CheckMessage, Error, Warning
from django.db import connections
from kombu.exceptions import SerializerNotInstalled
from kombu.serialization import prepare_accept_content

from celery_outbox.config import DEFAULTS, setting_errors
from celery_outbox.exceptions import OutboxConfigError
from celery_outbox.registry import load_store
from django_outbox.celery_app import import_app, project_app
from django_outbox.settings import settings

#: Name of the sweep task, and the content type of pickle.
SWEEP_TASK = "celery_outbox.sweep"
_PICKLE = {"pickle", "application/x-python-serialize"}


def _celery_app() -> Celery:
    """The app the project uses (:func:`~django_outbox.celery_app.project_app`), else
    Celery's current app (E005 reports a setting that does not import).
    """
    try:
        return project_app()
    except OutboxConfigError:
        from celery import current_app

        return current_app


def _celery_conf() -> Any:
    return _celery_app().conf


def _django_name(setting: str) -> str:
    return f"CELERY_{setting.upper()}"


def check_outbox_settings(**kwargs: Any) -> list[CheckMessage]:
    """E001: every ``outbox_*`` Celery setting is valid (as the worker will read it).

    Each bad setting is its own error, naming the value and the accepted range.
    """
    # ``conf.get`` as the worker reads them (``OutboxConfig.from_celery``): ``key in conf``
    # is False for a namespaced Django setting until something has read it.
    conf = _celery_conf()
    errors = setting_errors({key: conf.get(key, DEFAULTS[key]) for key in DEFAULTS})
    return [
        Error(message, id="django_outbox.E001", hint=f"Fix {_django_name(key)}.")
        for key, message in errors.items()
    ]


def check_store(**kwargs: Any) -> list[CheckMessage]:
    """E004: ``outbox_store`` imports and gives an ``OutboxStore`` (else every dispatch fails)."""
    app = _celery_app()
    path = app.conf.get("outbox_store")
    if path is None or "outbox_store" in setting_errors({"outbox_store": path}):
        return []  # the default store, or already reported by E001
    try:
        load_store(path, app)
    except OutboxConfigError as exc:
        return [
            Error(str(exc), id="django_outbox.E004", hint=f"Fix {_django_name('outbox_store')}.")
        ]
    return []


def check_celery_app(**kwargs: Any) -> list[CheckMessage]:
    """E005: ``DJANGO_OUTBOX_CELERY_APP`` names a Celery app (else the admin actions fail)."""
    path = settings.CELERY_APP
    if path is None:
        return []
    try:
        import_app(path)
    except OutboxConfigError as exc:
        return [Error(str(exc), id="django_outbox.E005")]
    return []


def check_task_serializer(**kwargs: Any) -> list[CheckMessage]:
    """E006: the workers accept what ``task_serializer`` writes (else every dispatch fails)."""
    conf = _celery_conf()
    accept = conf.accept_content
    if accept is None:
        return []
    try:
        written = set(prepare_accept_content([conf.task_serializer]) or ())
    except SerializerNotInstalled as exc:
        written = set()
        reason = str(exc)
    else:
        reason = ""
    if written and written <= set(prepare_accept_content(accept) or ()):
        return []
    return [
        Error(
            f"task_serializer={conf.task_serializer!r} ({_django_name('task_serializer')}) "
            f"is not in accept_content={list(accept)!r}: workers refuse what it writes, so "
            f"every outbox dispatch fails. {reason}".rstrip(),
            hint="Use 'json', or add the serializer to accept_content if you trust every producer.",
            id="django_outbox.E006",
        )
    ]


def check_pickle(**kwargs: Any) -> list[CheckMessage]:
    """W001: outbox rows are published as stored; with pickle, a row is code to run."""
    conf = _celery_conf()
    found = [
        name
        for name, value in (
            ("task_serializer", [conf.task_serializer]),
            ("accept_content", conf.accept_content or ()),
        )
        if _PICKLE & set(value)
    ]
    return [
        Warning(
            f"{name} ({_django_name(name)}) enables the pickle serializer: anyone who can "
            "write to the outbox table or the broker can run code in your workers.",
            hint="Use 'json' (the default).",
            id="django_outbox.W001",
        )
        for name in found
    ]


def check_databases(**kwargs: Any) -> list[CheckMessage]:
    """E002: ``DJANGO_OUTBOX_DATABASES`` lists database aliases that exist."""
    aliases = settings.DATABASES
    if isinstance(aliases, str) or not isinstance(aliases, Sequence) or not aliases:
        return [
            Error(
                f"DJANGO_OUTBOX_DATABASES={aliases!r} is not accepted: give a non-empty "
                "list of database aliases.",
                id="django_outbox.E002",
            )
        ]
    unknown = [alias for alias in aliases if alias not in django_settings.DATABASES]
    return [
        Error(
            f"DJANGO_OUTBOX_DATABASES names {alias!r}, which is not in DATABASES.",
            hint=f"Use one of {sorted(django_settings.DATABASES)}.",
            id="django_outbox.E002",
        )
        for alias in unknown
    ]


def check_use_tz(**kwargs: Any) -> list[CheckMessage]:
    """E003: the outbox reads and writes aware UTC datetimes."""
    if django_settings.USE_TZ:
        return []
    return [
        Error(
            "django_outbox needs USE_TZ = True: outbox times are timezone-aware UTC.",
            id="django_outbox.E003",
        )
    ]


def check_beat_entry(**kwargs: Any) -> list[CheckMessage]:
    """W002: with ``outbox_beat_schedule`` off, some beat entry must run the sweep."""
    conf = _celery_conf()
    if conf.get("outbox_beat_schedule", True) is not False:
        return []
    entries = (conf.beat_schedule or {}).values()
    if any(entry.get("task") == SWEEP_TASK for entry in entries):
        return []
    return [
        Warning(
            f"outbox_beat_schedule ({_django_name('outbox_beat_schedule')}) is False and no "
            f"beat_schedule entry runs {SWEEP_TASK!r}: rows not published on commit are never "
            "published.",
            hint="Remove the setting, or add a beat entry.",
            id="django_outbox.W002",
        )
    ]


def check_skip_locked(databases: Iterable[str] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """W003 (database check): sweeping needs ``SKIP LOCKED`` for concurrent sweepers."""
    wanted = set(databases or ())
    return [
        Warning(
            f"Database {alias!r} has no SELECT ... FOR UPDATE SKIP LOCKED: run one sweeper "
            "(one beat) for it at a time.",
            id="django_outbox.W003",
        )
        for alias in settings.DATABASES
        if alias in wanted
        and alias in django_settings.DATABASES
        and not connections[alias].features.has_select_for_update_skip_locked
    ]


#: Checks registered in ``DjangoOutboxConfig.ready()`` (besides the database check).
CHECKS: tuple[Callable[..., list[CheckMessage]], ...] = (
    check_outbox_settings,
    check_store,
    check_celery_app,
    check_task_serializer,
    check_pickle,
    check_databases,
    check_use_tz,
    check_beat_entry,
)
