"""The overview's entry in the admin: a proxy of the sweep table, without a table or rows of
its own, so the admin's "Celery outbox" section lists an "Overview" page
(:mod:`django_outbox.admin_overview`). :mod:`django_outbox.models` imports the model.
"""

from __future__ import annotations

from django.utils.translation import gettext_lazy as _

from django_outbox.sweep_models import SweepRecord


class Overview(SweepRecord):
    """The admin's overview page (no permissions of its own: it is open to users who may
    view dead letters or outbox messages)."""

    class Meta:
        proxy = True
        default_permissions = ()
        verbose_name = _("overview")
        verbose_name_plural = _("overview")
