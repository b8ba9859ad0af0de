"""django_outbox: the Django app of celery-outbox.

Add ``"django_outbox"`` to ``INSTALLED_APPS`` and run ``migrate``: the app installs its
ORM store (:class:`django_outbox.store.DjangoOutboxStore`) as the default outbox store
when Django starts, so every ``OutboxTask`` dispatch writes its row through the ORM in
the caller's transaction.
"""

from __future__ import annotations

import celery_outbox  # noqa: F401 - installs the old module paths
