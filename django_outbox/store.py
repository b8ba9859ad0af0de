"""``DjangoOutboxStore``: the outbox through Django's ORM and its transactions.

Every method takes ``using``, a database alias (``None`` means ``"default"``). Rows are
written in whatever ``transaction.atomic(using=...)`` block the caller is in; database
errors leave as :class:`~celery_outbox.exceptions.StoreError` with the cause chained.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime

from django.db import (
    DEFAULT_DB_ALIAS,
    DatabaseError,
    DataError,
    IntegrityError,
    connections,
    transaction,
)
from django.db.models import Case, F, Value, When

from celery_outbox.exceptions import StoreDataError, StoreError
from celery_outbox.records import (
    Claim,
    DeadLetterStatus,
    MessageStatus,
    NewDeadLetter,
    NewMessage,
    StoredDeadLetter,
    StoredMessage,
)
from celery_outbox.storage import OutboxStore, PublishCallback
from django_outbox import batches, claims, conversions, leases
from django_outbox.inserts import insert_message
from django_outbox.managers import OutboxMessageQuerySet, locking
from django_outbox.models import DeadLetter, DeliveryCount, OutboxMessage
from django_outbox.settings import settings

_PENDING, _FAILED = MessageStatus.PENDING.value, MessageStatus.FAILED.value


def _alias(using: str | None) -> str:
    return using or DEFAULT_DB_ALIAS


def _messages(alias: str) -> OutboxMessageQuerySet:
    rows: OutboxMessageQuerySet = OutboxMessage.objects.using(alias).all()
    return rows


@contextlib.contextmanager
def _store_errors(action: str) -> Iterator[None]:
    """Raise a database error as ``StoreError``, a refused value as ``StoreDataError``
    (never swallowed: the caller's transaction still rolls back)."""
    try:
        yield
    except (DataError, IntegrityError) as exc:  # a value the database refuses: not an outage
        raise StoreDataError(f"celery-outbox could not {action}: {exc}") from exc
    except DatabaseError as exc:
        raise StoreError(f"celery-outbox could not {action}: {exc}") from exc


def _one_statement_claims(alias: str) -> bool:
    """PostgreSQL claims in one autocommit statement (:mod:`django_outbox.claims`)."""
    connection = connections[alias]
    return connection.vendor == "postgresql" and not connection.in_atomic_block


def _claim_of(rows: list[OutboxMessage], lease_until: datetime) -> Claim:
    return Claim(
        messages=tuple(conversions.stored_message(row) for row in rows), lease_until=lease_until
    )


def _refresh_connection(alias: str) -> None:
    """``close_old_connections()`` for one alias, for batch work outside a request.

    Never inside an atomic block: Django would close the connection in the middle of it.
    """
    connection = connections[alias]
    if not connection.in_atomic_block:
        connection.close_if_unusable_or_obsolete()


class DjangoOutboxStore(OutboxStore):
    """The ORM store ``django_outbox`` installs as the default store in ``ready()``."""

    # -- dispatch -----------------------------------------------------------------------
    def add(self, message: NewMessage, *, using: str | None = None) -> int | None:
        """Insert a pending row in the caller's transaction (see :mod:`~django_outbox.inserts`)."""
        with _store_errors("write an outbox row"):
            return insert_message(message, using=_alias(using))

    def on_commit(self, callback: Callable[[], None], *, using: str | None = None) -> None:
        """``transaction.on_commit``: savepoint-aware; at once outside an atomic block."""
        transaction.on_commit(callback, using=_alias(using))

    def defer_publish(
        self, message: StoredMessage, publish: PublishCallback, *, using: str | None = None
    ) -> None:
        """Publish every row a transaction deferred in one callback (:mod:`~.batches`)."""
        batches.defer(message, publish, using=_alias(using))

    def still_leased(
        self, messages: Sequence[StoredMessage], *, using: str | None = None
    ) -> set[int]:
        """One ``SELECT`` of the ids and leases; each row must hold its message's lease."""
        alias = _alias(using)
        if connections[alias].vendor == "postgresql":
            with _store_errors("read outbox leases"):
                return leases.still_leased(messages, alias=alias)
        leased = {m.id: m.locked_until for m in messages}
        with _store_errors("read outbox leases"):
            rows = _messages(alias).pending().with_ids(leased).values_list("id", "locked_until")
            return {
                row_id for row_id, lease in rows if lease is not None and lease == leased[row_id]
            }

    # -- publishing and sweeping ----------------------------------------------------------
    def claim(
        self,
        ids: Iterable[int],
        *,
        now: datetime,
        lease_until: datetime,
        max_bytes: int | None = None,
        using: str | None = None,
    ) -> Claim:
        """Lease those of ``ids`` that are pending, due and unleased: two statements."""
        alias, ids = _alias(using), list(ids)
        if not ids:
            return Claim(messages=(), lease_until=lease_until)
        if _one_statement_claims(alias):
            with _store_errors("claim outbox rows"):
                rows = claims.claim_ids(
                    ids, now=now, lease_until=lease_until, max_bytes=max_bytes, alias=alias
                )
            return _claim_of(rows, lease_until)
        candidates = _messages(alias).with_ids(ids).due(now)
        return self._lease(candidates, None, max_bytes, lease_until=lease_until, alias=alias)

    def claim_due(
        self,
        *,
        now: datetime,
        created_before: datetime,
        limit: int,
        lease_until: datetime,
        max_bytes: int | None = None,
        using: str | None = None,
    ) -> Claim:
        """Lease up to ``limit`` due rows within ``max_bytes``, skipping locked rows."""
        alias = _alias(using)
        _refresh_connection(alias)
        if _one_statement_claims(alias):
            with _store_errors("claim outbox rows"):
                rows = claims.claim_due(
                    now=now,
                    created_before=created_before,
                    limit=limit,
                    lease_until=lease_until,
                    max_bytes=max_bytes,
                    alias=alias,
                )
            return _claim_of(rows, lease_until)
        candidates = _messages(alias).due(now, created_before)
        return self._lease(candidates, limit, max_bytes, lease_until=lease_until, alias=alias)

    def _lease(
        self,
        rows: OutboxMessageQuerySet,
        limit: int | None,
        max_bytes: int | None,
        *,
        lease_until: datetime,
        alias: str,
    ) -> Claim:
        with _store_errors("claim outbox rows"), transaction.atomic(using=alias):
            ids = claims.lock_within_budget(rows, limit, max_bytes)
            claimed = list(_messages(alias).with_ids(ids).order_by("available_at", "id"))
            if claimed:
                _messages(alias).with_ids(ids).update(locked_until=lease_until)
        return Claim(
            messages=tuple(
                conversions.stored_message(row, locked_until=lease_until) for row in claimed
            ),
            lease_until=lease_until,
        )

    def mark_published(
        self,
        claim: Claim,
        ids: Sequence[int],
        *,
        now: datetime,
        keep: bool,
        using: str | None = None,
    ) -> int:
        """Delete (or mark ``published``) the still-leased rows of ``ids``: one statement."""
        alias = _alias(using)
        if not ids:
            return 0
        if not keep and connections[alias].vendor == "postgresql":
            with _store_errors("mark outbox rows published"):
                return leases.delete_published(claim, ids, alias=alias)
        rows = _messages(alias).leased_by(ids, claim.leases)
        with _store_errors("mark outbox rows published"):
            if keep:
                return rows.update(
                    status=MessageStatus.PUBLISHED.value, published_at=now, locked_until=None
                )
            # Not .delete(): with any delete signal receiver Django would SELECT first.
            return int(rows._raw_delete(alias))

    def record_failure(
        self,
        claim: Claim,
        ids: Sequence[int],
        *,
        error: str,
        retry_at: datetime | None,
        max_attempts: int,
        using: str | None = None,
    ) -> int:
        """Count a failed publish and release the rows: one ``UPDATE``."""
        alias = _alias(using)
        if not ids:
            return 0
        rows = _messages(alias).leased_by(ids, claim.leases)
        with _store_errors("record a failed publish"):
            if retry_at is None:
                return rows.update(
                    status=_FAILED, attempts=F("attempts") + 1, last_error=error, locked_until=None
                )
            # ``status`` comes first: MySQL evaluates SET left to right, so it must
            # still see the old ``attempts``.
            gave_up = When(attempts__gte=max_attempts - 1, then=Value(_FAILED))
            return rows.update(
                status=Case(gave_up, default=Value(_PENDING)),
                attempts=F("attempts") + 1,
                last_error=error,
                available_at=retry_at,
                locked_until=None,
            )

    def reset(self, ids: Iterable[int], *, now: datetime, using: str | None = None) -> int:
        """Make rows pending and due now; a failed row gets a fresh attempt budget."""
        alias, ids = _alias(using), list(ids)
        if not ids:
            return 0
        with _store_errors("reset outbox rows"), transaction.atomic(using=alias):
            chosen = _resettable_ids(alias, ids)
            if not chosen:
                return 0
            # ``attempts`` first: it reads the old ``status`` (MySQL evaluates SET in order).
            fresh = When(status=_FAILED, then=Value(0))
            return (
                _messages(alias)
                .with_ids(chosen)
                .update(
                    attempts=Case(fresh, default=F("attempts")),
                    status=_PENDING,
                    available_at=now,
                    locked_until=None,
                )
            )

    def sweep_aliases(self) -> Sequence[str | None]:
        """``DJANGO_OUTBOX_DATABASES``: the aliases the sweep task covers."""
        return list(settings.DATABASES)

    def count_by_status(self, *, using: str | None = None) -> Mapping[MessageStatus, int]:
        """Rows per status, every status present."""
        alias = _alias(using)
        _refresh_connection(alias)
        with _store_errors("count outbox rows"):
            counts = _messages(alias).counts_by_status()
        return {status: counts.get(status.value, 0) for status in MessageStatus}

    def oldest_pending(self, *, using: str | None = None) -> datetime | None:
        """``created_at`` of the oldest pending row."""
        alias = _alias(using)
        _refresh_connection(alias)
        with _store_errors("read the oldest pending row"):
            return _messages(alias).oldest_pending_created_at()

    def purge(
        self,
        *,
        statuses: Iterable[MessageStatus],
        older_than: datetime,
        limit: int,
        using: str | None = None,
    ) -> int:
        """Delete up to ``limit`` old rows in ``statuses``: two statements."""
        alias, values = _alias(using), [MessageStatus(s).value for s in statuses]
        _refresh_connection(alias)
        with _store_errors("purge outbox rows"):
            # MySQL cannot DELETE ... WHERE id IN (SELECT ... LIMIT n): read the ids first.
            ids = list(
                _messages(alias).purgeable(values, older_than).values_list("id", flat=True)[:limit]
            )
            if not ids:
                return 0
            return int(_messages(alias).with_ids(ids).filter(status__in=values)._raw_delete(alias))

    # -- dead letters -------------------------------------------------------------------
    # -- deliveries --------------------------------------------------------------------
    def record_delivery(self, task_id: str, *, now: datetime, using: str | None = None) -> int:
        """Add one to the task's delivery count (2 on its first redelivery); committed."""
        alias = _alias(using)
        counts = DeliveryCount.objects.using(alias)
        with _store_errors("count a redelivery"), transaction.atomic(using=alias):
            if not counts.filter(task_id=task_id).update(
                deliveries=F("deliveries") + 1, updated_at=now
            ):
                try:
                    with transaction.atomic(using=alias):
                        counts.create(task_id=task_id, deliveries=2, updated_at=now)
                except IntegrityError:  # another worker counted it first
                    counts.filter(task_id=task_id).update(
                        deliveries=F("deliveries") + 1, updated_at=now
                    )
            return int(counts.get(task_id=task_id).deliveries)

    def forget_deliveries(self, task_id: str, *, using: str | None = None) -> None:
        """Drop the task's delivery count (a no-op without one)."""
        with _store_errors("clear a delivery count"):
            DeliveryCount.objects.using(_alias(using)).filter(task_id=task_id).delete()

    def add_dead_letter(self, letter: NewDeadLetter, *, using: str | None = None) -> int:
        """Write a dead letter in the caller's transaction (at once outside one)."""
        row = conversions.new_dead_letter(letter)
        with _store_errors("write a dead letter"):
            row.save(using=_alias(using), force_insert=True)
        return int(row.pk)

    def get_dead_letter(
        self, letter_id: int, *, using: str | None = None
    ) -> StoredDeadLetter | None:
        """The dead letter with that id, or ``None``."""
        with _store_errors("read a dead letter"):
            row = DeadLetter.objects.using(_alias(using)).filter(pk=letter_id).first()
        return None if row is None else conversions.stored_dead_letter(row)

    def requeue_dead_letter(
        self,
        letter_id: int,
        message: NewMessage,
        *,
        by: str,
        now: datetime,
        using: str | None = None,
    ) -> tuple[str, int | None]:
        """Add ``message`` and mark the letter ``requeued``, in one transaction."""
        alias = _alias(using)
        with _store_errors("requeue a dead letter"), transaction.atomic(using=alias):
            letter = locking(
                DeadLetter.objects.using(alias).filter(pk=letter_id), skip_locked=False
            ).first()
            if letter is None:
                raise LookupError(f"No dead letter with id {letter_id!r} in {alias!r}.")
            if letter.status != DeadLetterStatus.DEAD.value:
                return letter.requeued_task_id, None
            row_id = insert_message(message, using=alias)
            DeadLetter.objects.using(alias).filter(pk=letter_id).update(
                status=DeadLetterStatus.REQUEUED.value,
                requeued_at=now,
                requeued_by=by,
                requeued_task_id=message.task_id,
            )
        return message.task_id, row_id

    def discard_dead_letter(self, letter_id: int, *, using: str | None = None) -> bool:
        """Mark a ``dead`` letter ``discarded``: one ``UPDATE``."""
        with _store_errors("discard a dead letter"):
            changed = (
                DeadLetter.objects.using(_alias(using))
                .dead()
                .filter(pk=letter_id)
                .update(status=DeadLetterStatus.DISCARDED.value)
            )
        return bool(changed)


def _resettable_ids(alias: str, ids: list[int]) -> list[int]:
    """Lock ``ids``' pending and failed rows; keep one per task id with no other pending row."""
    rows = list(
        locking(_messages(alias).with_ids(ids).resettable(), skip_locked=False)
        .order_by("id")
        .values_list("id", "task_id", "status")
    )
    failed = [(row_id, task_id) for row_id, task_id, status in rows if status == _FAILED]
    chosen = [row_id for row_id, _, status in rows if status == _PENDING]
    taken = _messages(alias).task_ids_pending(task_id for _, task_id in failed)
    for row_id, task_id in failed:
        if task_id not in taken:
            taken.add(task_id)
            chosen.append(row_id)
    return chosen
