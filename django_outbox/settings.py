"""Django-only settings of celery-outbox, read lazily from ``django.conf.settings``.

The ``outbox_*`` settings are Celery settings (``CELERY_OUTBOX_*`` in a Django project
using the ``CELERY`` namespace) and are not repeated here. Only what makes sense in
Django alone lives here, as ``DJANGO_OUTBOX_<NAME>``:

===============================  ==============  ===============  ==================================
setting                          type            default          meaning
===============================  ==============  ===============  ==================================
``DJANGO_OUTBOX_DATABASES``      ``list[str]``   ``["default"]``  database aliases the sweep covers
``DJANGO_OUTBOX_CELERY_APP``     ``str | None``  ``None``         Celery app of ``manage.py outbox``
``DJANGO_OUTBOX_METRICS_TOKEN``  ``str | None``  ``None``         bearer token of the metrics view
===============================  ==============  ===============  ==================================

Nothing is read at import time: every attribute access of :data:`settings` looks the
value up in Django's settings, so ``override_settings`` works.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: Prefix of every Django-only setting of this app.
PREFIX = "DJANGO_OUTBOX_"


class Settings:
    """Typed defaults; reading an attribute returns ``settings.DJANGO_OUTBOX_<NAME>`` if set."""

    #: Database aliases holding an outbox table that the sweep task covers.
    DATABASES: Sequence[str] = ("default",)
    #: Dotted path of the Celery app ``manage.py outbox`` uses (``None``: the current app).
    CELERY_APP: str | None = None
    #: The token a scraper sends as ``Authorization: Bearer <token>`` to read the
    #: metrics view (``None``: only staff users with the view permission may).
    METRICS_TOKEN: str | None = None

    def __getattribute__(self, name: str) -> Any:
        default = super().__getattribute__(name)
        if name.startswith("_") or not name.isupper():
            return default
        from django.conf import settings as django_settings

        return getattr(django_settings, PREFIX + name, default)


#: The one instance to read settings from: ``from django_outbox.settings import settings``.
settings = Settings()
