"""Copied to ``t/conftest.py`` of Celery's source distribution by the compatibility run.

With ``CELERY_COMPAT_MODE=outbox`` every task of Celery's integration app is an
``OutboxTask`` (``task_cls``, as a user moving a whole project would set it); with
``plain`` the app is Celery's own. ``CELERY_COMPAT_AUTORETRY=off`` gives the outbox tasks
``autoretry_for = ()``, the documented option that restores Celery's failing-task
behaviour. ``CELERY_COMPAT_SITE`` (test requirements installed beside the project's
environment) goes at the end of ``sys.path``.
"""

from __future__ import annotations

import os
import sys

import pytest

if os.environ.get("CELERY_COMPAT_SITE"):
    sys.path.append(os.environ["CELERY_COMPAT_SITE"])


@pytest.fixture(scope="session")
def celery_parameters():
    if os.environ.get("CELERY_COMPAT_MODE") == "outbox":
        from celery_outbox import OutboxTask

        if os.environ.get("CELERY_COMPAT_AUTORETRY") == "off":

            class NoAutoretryTask(OutboxTask):
                autoretry_for = ()

            return {"task_cls": NoAutoretryTask}
        return {"task_cls": OutboxTask}
    return {}
