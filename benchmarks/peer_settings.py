"""Django settings of the django-celery-outbox process (its own database)."""

from __future__ import annotations

from benchmarks.settings import DATABASES as _OURS
from benchmarks.settings import PEER_DATABASE

SECRET_KEY = "celery-outbox-benchmarks-only"  # a benchmark-only key, never deployed
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django.contrib.contenttypes", "django_celery_outbox"]
DATABASES = {
    "default": {
        **_OURS["default"],
        "NAME": PEER_DATABASE,
    }
}
CELERY_OUTBOX_APP = "benchmarks.peer_relay.app"
LOGGING_CONFIG = None
