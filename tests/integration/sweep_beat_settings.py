"""Django settings of the beat tests' subprocesses: the outbox and django-celery-beat, on the
database ``OUTBOX_DJANGO_DB_URL`` names (see :mod:`tests.django.db_settings`).
"""

from __future__ import annotations

from tests.django.db_settings import *  # noqa: F403
from tests.django.db_settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "django_celery_beat"]
