"""URLs of celery-outbox: ``path("outbox/", include("django_outbox.urls"))``.

``metrics/``: the Prometheus metrics (:mod:`django_outbox.views`; needs
``pip install celery-outbox[prometheus]``).
"""

from __future__ import annotations

from django.urls import path

from django_outbox.views import metrics

app_name = "django_outbox"

urlpatterns = [path("metrics/", metrics, name="metrics")]
