"""One strategy per database vendor, and the generic ORM one.

The generic strategy: every outbox-row operation through Django's ORM, on any database.

MySQL/MariaDB and any database without a strategy of its own use it as is; the
PostgreSQL and SQLite strategies replace some of its methods with one raw statement
(:mod:`django_outbox.store.statements`). Errors are left to the caller
(:class:`~django_outbox.store.DjangoOutboxStore` wraps them).

Where the ORM writes ``UPDATE ... SET a = CASE ..., b = ...``, the order of the columns
matters on MySQL, which evaluates ``SET`` left to right: a ``CASE`` reading another
column comes before the assignment of that column.

One strategy per database vendor, chosen once per database alias.

=================  ========================================================================
vendor             strategy
=================  ========================================================================
PostgreSQL         :class:`PostgreSQLStrategy`: upsert, one-statement claims outside a
                   transaction, lease checks and deletes by arrays (:mod:`.sql`)
SQLite             :class:`SQLiteStrategy`: upsert (3.35+), the ORM for the rest
MySQL / MariaDB    :class:`MySQLStrategy`: a plain insert checked by the unique key over
                   the generated ``pending_task_id``; the ORM for the rest (no
                   ``RETURNING``: the ORM path is written for them)
any other          :class:`~django_outbox.store.vendors.OrmStrategy`
=================  ========================================================================
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TypeVar

from django.db import connections, models, transaction
from django.db.models import Case, F, Value, When
from django.db.models.functions import Length

from celery_outbox.store.base import Supersedes, within_budget
from celery_outbox.store.records import Claim, MessageStatus, NewMessage, StoredMessage
from django_outbox._compat import raw_delete
from django_outbox.models import OutboxMessage, OutboxMessageQuerySet
from django_outbox.store import rows as convert
from django_outbox.store import statements as sql
from django_outbox.store import transactions as published
from django_outbox.store.calls import clock_of

# --- The generic strategy: every outbox-row operation through Django's ORM, on any database.

_PENDING = MessageStatus.PENDING.value
_FAILED = MessageStatus.FAILED.value

_M = TypeVar("_M", bound=models.Model)


def messages(alias: str) -> OutboxMessageQuerySet:
    """Every outbox row of ``alias``."""
    found: OutboxMessageQuerySet = OutboxMessage.objects.using(alias).all()
    return found


def locking(rows: models.QuerySet[_M], *, skip_locked: bool) -> models.QuerySet[_M]:
    """``rows`` with ``SELECT ... FOR UPDATE``, skipping locked rows where the database can.

    Databases without ``FOR UPDATE`` (SQLite) ignore it: their write lock serialises
    writers instead.
    """
    can_skip = connections[rows.db].features.has_select_for_update_skip_locked
    return rows.select_for_update(skip_locked=skip_locked and can_skip)


class OrmStrategy:
    """Outbox rows through the ORM: the behaviour every other strategy must match."""

    def insert(self, message: NewMessage, *, alias: str) -> int | None:
        """Insert ``message``; its row id, or ``None`` when its task id is already pending.

        A ``SELECT`` comes first: on a database with neither a partial unique index nor a
        strategy of its own, two concurrent transactions dispatching the same explicit
        task id may then both insert a row (documented).
        """
        if messages(alias).pending().filter(task_id=message.task_id).exists():
            return None
        row = convert.new_message(message, created_at=clock_of(alias)())
        row.save(using=alias, force_insert=True)
        return int(row.pk)

    def supersede(self, message: NewMessage, supersedes: Supersedes, *, alias: str) -> int | None:
        """Replace the pending row of ``message``'s task id when ``supersedes`` accepts it:
        locked, deleted while still pending, and ``message`` inserted, in one transaction
        (a savepoint of the caller's); the new id, or ``None`` when a pending row stays.
        """
        with transaction.atomic(using=alias):
            rows = messages(alias).pending().filter(task_id=message.task_id)
            pending = locking(rows, skip_locked=False).order_by("id").first()
            if pending is not None:
                if not supersedes(convert.stored_message(pending)):
                    return None
                raw_delete(messages(alias).pending().filter(pk=pending.pk), alias)
            return self.insert(message, alias=alias)

    def still_leased(self, leased: Sequence[StoredMessage], *, alias: str) -> set[int]:
        """The ids of ``leased`` whose row is pending and holds the message's own lease."""
        wanted = {m.id: m.locked_until for m in leased}
        found = messages(alias).pending().with_ids(wanted).values_list("id", "locked_until")
        return {row_id for row_id, lease in found if lease is not None and lease == wanted[row_id]}

    def claim_ids(
        self,
        ids: list[int],
        *,
        now: datetime,
        lease_until: datetime,
        max_bytes: int | None,
        alias: str,
    ) -> Claim:
        """Lease those of ``ids`` that are pending, due and unleased: two statements."""
        candidates = messages(alias).with_ids(ids).due(now)
        return self._lease(candidates, None, max_bytes, lease_until=lease_until, alias=alias)

    def claim_due(
        self,
        *,
        now: datetime,
        created_before: datetime,
        limit: int,
        lease_until: datetime,
        max_bytes: int | None,
        alias: str,
    ) -> Claim:
        """Lease up to ``limit`` due rows within ``max_bytes``, skipping locked rows."""
        candidates = messages(alias).due(now, created_before)
        return self._lease(candidates, limit, max_bytes, lease_until=lease_until, alias=alias)

    def _lease(
        self,
        candidates: OutboxMessageQuerySet,
        limit: int | None,
        max_bytes: int | None,
        *,
        lease_until: datetime,
        alias: str,
    ) -> Claim:
        with transaction.atomic(using=alias):
            ids = _lock_within_budget(candidates, limit, max_bytes)
            claimed = list(messages(alias).with_ids(ids).order_by("available_at", "id"))
            if claimed:
                messages(alias).with_ids(ids).update(locked_until=lease_until)
        return Claim(
            messages=tuple(
                convert.stored_message(row, locked_until=lease_until) for row in claimed
            ),
            lease_until=lease_until,
        )

    def delete_published(self, claim: Claim, ids: Sequence[int], *, alias: str) -> int:
        """Delete the rows ``ids`` of ``claim`` that still hold their lease; how many."""
        return raw_delete(messages(alias).leased_by(ids, claim.leases), alias)

    def keep_published(self, claim: Claim, ids: Sequence[int], *, now: datetime, alias: str) -> int:
        """Mark the rows ``ids`` of ``claim`` that still hold their lease ``published``."""
        return (
            messages(alias)
            .leased_by(ids, claim.leases)
            .update(status=MessageStatus.PUBLISHED.value, published_at=now, locked_until=None)
        )

    def record_failure(
        self,
        claim: Claim,
        ids: Sequence[int],
        *,
        error: str,
        retry_at: datetime | None,
        alias: str,
    ) -> int:
        """Count a failed publish and release the rows (``failed`` without ``retry_at``,
        keeping its due time): one ``UPDATE``.
        """
        rows = messages(alias).leased_by(ids, claim.leases)
        due = {} if retry_at is None else {"available_at": retry_at}
        return rows.update(
            status=_FAILED if retry_at is None else _PENDING,
            attempts=F("attempts") + 1,
            last_error=error,
            locked_until=None,
            **due,
        )

    def reset(self, ids: list[int], *, now: datetime, alias: str) -> int:
        """Make rows pending and due now; a failed row gets a fresh attempt budget."""
        with transaction.atomic(using=alias):
            chosen = _resettable_ids(alias, ids)
            if not chosen:
                return 0
            # ``attempts`` first: it reads the old ``status``.
            fresh = When(status=_FAILED, then=Value(0))
            return (
                messages(alias)
                .with_ids(chosen)
                .update(
                    attempts=Case(fresh, default=F("attempts")),
                    status=_PENDING,
                    available_at=now,
                    locked_until=None,
                )
            )

    def purge(self, *, statuses: list[str], older_than: datetime, limit: int, alias: str) -> int:
        """Delete up to ``limit`` old rows in ``statuses``: two statements."""
        # MySQL cannot DELETE ... WHERE id IN (SELECT ... LIMIT n): read the ids first.
        ids = list(
            messages(alias).purgeable(statuses, older_than).values_list("id", flat=True)[:limit]
        )
        if not ids:
            return 0
        return raw_delete(messages(alias).with_ids(ids).filter(status__in=statuses), alias)


def _lock_within_budget(
    rows: OutboxMessageQuerySet, limit: int | None, max_bytes: int | None
) -> list[int]:
    """Lock up to ``limit`` of ``rows`` (inside a transaction) reading only their ids and
    sizes; the ids a claim of ``max_bytes`` takes, so no payload beyond the budget leaves
    the database.
    """
    locked = locking(rows, skip_locked=True).annotate(size=Length("payload"))
    sized = list((locked[:limit] if limit is not None else locked).values_list("id", "size"))
    return [row_id for row_id, _ in sized[: within_budget((s for _, s in sized), max_bytes)]]


def _resettable_ids(alias: str, ids: Iterable[int]) -> list[int]:
    """Lock ``ids``' pending and failed rows; keep one per task id with no other pending row."""
    found = list(
        locking(messages(alias).with_ids(ids).resettable(), skip_locked=False)
        .order_by("id")
        .values_list("id", "task_id", "status")
    )
    failed = [(row_id, task_id) for row_id, task_id, status in found if status == _FAILED]
    chosen = [row_id for row_id, _, status in found if status == _PENDING]
    taken = messages(alias).task_ids_pending(task_id for _, task_id in failed)
    for row_id, task_id in failed:
        if task_id not in taken:
            taken.add(task_id)
            chosen.append(row_id)
    return chosen


# --- One strategy per database vendor, chosen once per database alias.


class SQLiteStrategy(OrmStrategy):
    """SQLite 3.35+: one ``INSERT ... ON CONFLICT ... RETURNING`` per dispatch."""

    def insert(self, message: NewMessage, *, alias: str) -> int | None:
        """Insert ``message`` unless its task id is already pending (one statement)."""
        return sql.upsert(message, alias=alias)


class MySQLStrategy(OrmStrategy):
    """MySQL/MariaDB: one ``INSERT`` per dispatch, refused by the key over pending task ids
    (:mod:`celery_outbox.store.schema`) when its task id is already pending.
    """

    def insert(self, message: NewMessage, *, alias: str) -> int | None:
        """Insert ``message`` unless its task id is already pending (one statement)."""
        return sql.insert_pending(message, alias=alias)


class PostgreSQLStrategy(OrmStrategy):
    """PostgreSQL: the hot paths in one raw statement each (:mod:`.sql`).

    Claims take one autocommit statement; inside a caller's atomic block they take the
    ORM path, which locks inside that block.
    """

    def insert(self, message: NewMessage, *, alias: str) -> int | None:
        """Insert ``message`` unless its task id is already pending (one statement)."""
        return sql.upsert(message, alias=alias)

    def still_leased(self, leased: Sequence[StoredMessage], *, alias: str) -> set[int]:
        """One ``SELECT`` joining the rows to their ``(id, lease)`` pairs."""
        pairs = [(m.id, m.locked_until) for m in leased if m.locked_until is not None]
        return sql.still_leased(pairs, alias=alias) if pairs else set()

    def claim_ids(
        self,
        ids: list[int],
        *,
        now: datetime,
        lease_until: datetime,
        max_bytes: int | None,
        alias: str,
    ) -> Claim:
        """Lease those of ``ids`` that are pending, due and unleased: one statement."""
        if connections[alias].in_atomic_block:
            return super().claim_ids(
                ids, now=now, lease_until=lease_until, max_bytes=max_bytes, alias=alias
            )
        found = sql.claim_ids(
            ids, now=now, lease_until=lease_until, max_bytes=max_bytes, alias=alias
        )
        return _claim_of(found, lease_until)

    def claim_due(
        self,
        *,
        now: datetime,
        created_before: datetime,
        limit: int,
        lease_until: datetime,
        max_bytes: int | None,
        alias: str,
    ) -> Claim:
        """Lease up to ``limit`` due rows within ``max_bytes``: one statement."""
        if connections[alias].in_atomic_block:
            return super().claim_due(
                now=now,
                created_before=created_before,
                limit=limit,
                lease_until=lease_until,
                max_bytes=max_bytes,
                alias=alias,
            )
        found = sql.claim_due(
            now=now,
            created_before=created_before,
            limit=limit,
            lease_until=lease_until,
            max_bytes=max_bytes,
            alias=alias,
        )
        return _claim_of(found, lease_until)

    def delete_published(self, claim: Claim, ids: Sequence[int], *, alias: str) -> int:
        """One ``DELETE`` of the rows still holding their lease; after a commit's publish,
        handed to a thread (:mod:`.published`), which deletes them soon after.
        """
        connection = connections[alias]
        if not connection.in_atomic_block and published.rows_of(alias).took(
            claim, ids, dialect=connection.vendor
        ):
            return len(ids)
        wanted = set(ids)
        pairs = [
            (m.id, m.locked_until or claim.lease_until) for m in claim.messages if m.id in wanted
        ]
        return published.delete_published(pairs, alias=alias)


def _claim_of(found: list[StoredMessage], lease_until: datetime) -> Claim:
    return Claim(messages=tuple(found), lease_until=lease_until)


#: The strategy of each alias, chosen on its first use.
_CHOSEN: dict[str, OrmStrategy] = {}


def strategy_for(alias: str) -> OrmStrategy:
    """The strategy of database ``alias`` (chosen once, from its vendor and features)."""
    strategy = _CHOSEN.get(alias)
    if strategy is None:
        strategy = _CHOSEN[alias] = _choose(alias)
    return strategy


def _choose(alias: str) -> OrmStrategy:
    connection = connections[alias]
    if connection.vendor == "postgresql":
        return PostgreSQLStrategy()
    if connection.vendor == "sqlite" and connection.features.can_return_columns_from_insert:
        return SQLiteStrategy()
    if connection.vendor == "mysql":
        return MySQLStrategy()
    return OrmStrategy()
