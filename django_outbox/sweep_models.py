"""The sweep table: when the sweep of this database last recorded itself
(:mod:`celery_outbox.monitoring`).

Column names are those of the SQLAlchemy table (``docs/schema.md``), so one database can
be served by either store. :mod:`django_outbox.models` imports the model.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from celery_outbox.records import SWEEP_TABLE


class SweepRecord(models.Model):
    """One row per kind of sweep (``sweep``): its last run, by the database's clock.

    Written at most once per ``outbox_sweep_interval`` whatever the number of sweepers;
    read by ``manage.py outbox health`` and ``outbox status``. Internal: written by the
    store only.
    """

    name = models.CharField(_("name"), max_length=64, primary_key=True)
    last_sweep_at = models.DateTimeField(_("last sweep at"))

    class Meta:
        db_table = SWEEP_TABLE
        verbose_name = _("sweep record")
        verbose_name_plural = _("sweep records")

    def __str__(self) -> str:
        return f"{self.name} last ran {self.last_sweep_at:%Y-%m-%d %H:%M:%S}"
