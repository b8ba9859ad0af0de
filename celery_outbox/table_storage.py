"""How PostgreSQL stores the outbox table: half of each page kept free for leases.

Every claim leases its rows with an ``UPDATE`` of ``locked_until``, a column no index
holds. PostgreSQL writes such an update as a heap-only tuple (HOT) on the row's own page
when that page has room: no new entry in any of the table's five indexes. On a table
packed full (the default fill factor, 100) every lease went to another page and wrote
five index entries: half of a 500-row claim's time in the database, and a due index that
grew with each claim until a vacuum. A fill factor of 50 leaves room for each row's
lease on its page (an outbox row is written once, leased, then deleted: the table is
small in steady state, so the space costs little). It applies to pages written after it
is set; an existing table is not rewritten. Other databases keep their defaults.

Both stores set it: Django's migration ``0012_outbox_fillfactor`` and the SQLAlchemy
table's ``CREATE`` (:mod:`celery_outbox.sqlalchemy.tables`).
"""

from __future__ import annotations

from celery_outbox.records import OUTBOX_TABLE

#: Percent of each page of the outbox table filled by inserts (PostgreSQL).
FILLFACTOR = 50
#: Sets it (pages written from then on).
SET_FILLFACTOR = f"ALTER TABLE {OUTBOX_TABLE} SET (fillfactor = {FILLFACTOR})"
#: Back to PostgreSQL's default.
RESET_FILLFACTOR = f"ALTER TABLE {OUTBOX_TABLE} RESET (fillfactor)"
