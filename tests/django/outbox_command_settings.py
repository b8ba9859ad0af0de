"""Settings of the ``outbox`` command subprocesses: the database from the environment
(:mod:`tests.django.db_settings`) and the command's Celery app.
"""

from __future__ import annotations

from tests.django.db_settings import *  # noqa: F403

DJANGO_OUTBOX_CELERY_APP = "tests.django.outbox_command_app:app"

#: The command's app turns the beat entry off: these processes sweep with ``outbox relay``.
SILENCED_SYSTEM_CHECKS = ["django_outbox.W002"]
