"""``celery -A tests.integration.sweep_beat_app beat|worker``: beat and worker of the beat tests.

With ``OUTBOX_TEST_DJANGO=1`` the app runs in Django (:mod:`sweep_beat_settings`: the
ORM store, django-celery-beat); otherwise on the SQLAlchemy store of
:mod:`tests.integration.sweep_app`. Both sweep every 0.5 s with no grace.
"""

from __future__ import annotations

import os

from celery import Celery

#: Fast sweeps, so a test sees the beat entry at work within seconds.
BEAT_CONF = {"outbox_sweep_interval": 0.5, "outbox_publish_grace": 0.0}


def _django_app() -> Celery:
    import django

    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.integration.sweep_beat_settings"
    django.setup()
    from tests.django.celery_app import create_app

    # django-celery-beat stores intervals in whole seconds.
    return create_app(
        os.environ["OUTBOX_TEST_BROKER"],
        os.environ["OUTBOX_TEST_QUEUE"],
        **{**BEAT_CONF, "outbox_sweep_interval": 1.0},
    )


def _sqlalchemy_app() -> Celery:
    from tests.integration.sweep_app import create_app

    return create_app(
        os.environ["OUTBOX_TEST_BROKER"],
        os.environ["OUTBOX_TEST_QUEUE"],
        os.environ["OUTBOX_TEST_DB"],
        outbox_beat_schedule=True,
        **BEAT_CONF,
    )


app = _django_app() if os.environ.get("OUTBOX_TEST_DJANGO") == "1" else _sqlalchemy_app()
