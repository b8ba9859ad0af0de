"""The Django app: installs the ORM store, the signals and the system checks."""

from __future__ import annotations

import importlib.util

from django.apps import AppConfig
from django.core import checks as django_checks
from django.utils.translation import gettext_lazy as _


class DjangoOutboxConfig(AppConfig):
    """``INSTALLED_APPS = [..., "django_outbox"]``."""

    name = "django_outbox"
    label = "django_outbox"
    verbose_name = _("Celery outbox")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Make the ORM store the default outbox store; count the metrics when
        ``prometheus_client`` is installed; connect signals; register checks;
        warn about canvases with steps that are not atomic while ``DEBUG`` is on.
        """
        from django.conf import settings

        from celery_outbox.registry import set_default_store
        from celery_outbox.workflows import checks as canvas_warnings
        from django_outbox import checks, signals
        from django_outbox.store import DjangoOutboxStore

        set_default_store(DjangoOutboxStore())
        if importlib.util.find_spec("prometheus_client") is not None:
            import celery_outbox.metrics  # noqa: F401 - the counters count from now on
        canvas_warnings.enable(lambda: bool(settings.DEBUG))
        signals.connect()
        for check in checks.CHECKS:
            django_checks.register(check, "django_outbox")
        django_checks.register(
            checks.check_skip_locked, "django_outbox", django_checks.Tags.database
        )
