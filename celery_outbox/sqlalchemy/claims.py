"""The claim statement: lease due rows, locked where the database can, cut at a byte budget.

With ``UPDATE ... RETURNING`` (PostgreSQL, SQLite) one statement picks the candidates
(``FOR UPDATE SKIP LOCKED`` on PostgreSQL), keeps those within the budget with a running
sum of their payload sizes, leases them and returns them. Without it (MySQL, MariaDB) the
candidates' ids and sizes are read and locked first, so no payload beyond the budget is
ever sent to the client.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import CTE, Connection, Select, Table, func, select, update

from celery_outbox.records import StoredMessage
from celery_outbox.rows import stored_message
from celery_outbox.sqlalchemy.statements import has_skip_locked
from celery_outbox.storage import within_budget


def lease(
    conn: Connection,
    table: Table,
    candidates: Select[Any],
    *,
    lease_until: datetime,
    max_bytes: int | None = None,
) -> list[StoredMessage]:
    """Lease the rows ``candidates`` selects (locked, skipping locked rows, where the
    database can), ordered by ``(available_at, id)`` and cut at ``max_bytes`` of payload;
    return them."""
    c = table.c
    if has_skip_locked(conn):
        candidates = candidates.with_for_update(skip_locked=True)
    size = (func.length if conn.dialect.name == "sqlite" else func.octet_length)(c.payload)
    sized = candidates.with_only_columns(c.id, c.available_at, size.label("size"))
    if conn.dialect.update_returning:
        stmt = (
            update(table)
            .where(c.id.in_(_within_budget(sized.cte("celery_outbox_claim"), max_bytes)))
            .values(locked_until=lease_until)
            .returning(*c)
        )
        messages = [stored_message(row) for row in conn.execute(stmt).mappings().all()]
    else:
        found = conn.execute(sized).all()  # locks the candidates; payloads stay behind
        ids = [row.id for row in found[: within_budget((row.size for row in found), max_bytes)]]
        if ids:
            conn.execute(update(table).where(c.id.in_(ids)).values(locked_until=lease_until))
        rows = conn.execute(select(table).where(c.id.in_(ids))).mappings().all() if ids else []
        messages = [stored_message(row) for row in rows]
    return sorted(messages, key=lambda m: (m.available_at, m.id))


def _within_budget(sized: CTE, max_bytes: int | None) -> Select[Any]:
    """The ids of ``sized`` (id, available_at, size) a claim of ``max_bytes`` takes: each
    row whose predecessors hold fewer bytes (as :func:`within_budget` counts)."""
    if max_bytes is None:
        return select(sized.c.id)
    order = (sized.c.available_at, sized.c.id)
    before = func.sum(sized.c.size).over(order_by=order) - sized.c.size
    running = select(sized.c.id, before.label("before")).cte("celery_outbox_budget")
    return select(running.c.id).where(running.c.before < max_bytes)
