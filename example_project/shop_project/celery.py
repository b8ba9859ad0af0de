"""The shop's Celery app: settings come from Django's, as ``CELERY_*`` names.

``celery -A shop_project worker -B`` runs a worker with an embedded beat; the outbox
sweep task and its beat entry register themselves (``celery_outbox`` is imported by the
``django_outbox`` app).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from celery import Celery
from celery.signals import worker_ready

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop_project.settings")

#: The Celery app of the shop.
app = Celery("shop_project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

#: When set, the worker touches this file once it consumes (``demo.py`` waits for it).
READY_FILE_ENV = "SHOP_WORKER_READY_FILE"


@worker_ready.connect
def announce_ready(**kwargs: Any) -> None:
    """Touch ``$SHOP_WORKER_READY_FILE`` when the worker is ready to consume."""
    path = os.environ.get(READY_FILE_ENV)
    if path:
        Path(path).touch()
