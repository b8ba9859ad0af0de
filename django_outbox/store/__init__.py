"""The Django store: the outbox through Django's ORM, one strategy per database vendor.

=====================  ==============================================================
module                 what it holds
=====================  ==============================================================
:mod:`.outbox`         :class:`DjangoOutboxStore`: delegation to the modules below
:mod:`.calls`          the alias a call uses (an atomic task's own), error wrapping
:mod:`.completions`    ``CompletedTask`` rows: atomic tasks run once per task id
:mod:`.workflows`      ``Workflow`` rows and chord joins (durable canvases)
:mod:`.monitoring`     the backlog and the sweep record, on the database's clock
:mod:`.vendors`        the PostgreSQL and SQLite strategies; one chosen per alias
:mod:`.orm`            the generic ORM strategy (MySQL/MariaDB and any other database)
:mod:`.sql`            every raw SQL statement of the store
:mod:`.rows`           row <-> record conversions
:mod:`.letters`        dead letters and delivery counts
:mod:`.batches`        one on-commit publish per transaction
=====================  ==============================================================

``outbox_store = "django_outbox.store.DjangoOutboxStore"`` names the class.
"""

from __future__ import annotations

from django_outbox.store.store import DjangoOutboxStore

__all__ = ["DjangoOutboxStore"]
