"""One harness per store: the store, its transactions, and how to empty it.

The contract tests only talk to :class:`Harness`, so every store is held to the same
tests. A harness's ``transaction()`` commits when its block ends and rolls back when
the block raises; ``savepoint()`` is a nested transaction inside it.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from celery_outbox.store.base import OutboxStore
from celery_outbox.store.records import StoredMessage, stored_message

T = TypeVar("T")


class Harness(abc.ABC):
    """A store under test and the transactions of its world."""

    #: Whether claims from several threads really run concurrently (real databases).
    concurrent: bool = True

    def __init__(self, store: OutboxStore) -> None:
        self.store = store

    @abc.abstractmethod
    @contextmanager
    def transaction(self) -> Iterator[None]:
        """An outermost transaction: commits at the end, rolls back if the block raises."""

    @abc.abstractmethod
    @contextmanager
    def savepoint(self) -> Iterator[None]:
        """A savepoint inside the current :meth:`transaction`."""

    @abc.abstractmethod
    def clear(self) -> None:
        """Delete every row of the store's tables."""

    @abc.abstractmethod
    def read(self, row_id: int) -> StoredMessage:
        """The outbox row ``row_id`` as it is now, whatever its status."""

    @abc.abstractmethod
    def rows(self) -> list[StoredMessage]:
        """Every outbox row as it is now, whatever its status."""

    def settle(self) -> None:  # noqa: B027 - a hook: the other stores defer nothing
        """Run whatever deletes of published rows a store deferred (Django's on-commit
        publisher hands them to a thread); nothing for the others.
        """

    def in_thread(self, work: Callable[[], T]) -> T:
        """Run ``work`` as a thread's body (and release what the thread opened)."""
        return work()


class MemoryHarness(Harness):
    """``celery_outbox.testing.InMemoryOutboxStore``."""

    def __init__(self) -> None:
        from celery_outbox.testing import InMemoryOutboxStore

        self.memory = InMemoryOutboxStore()
        super().__init__(self.memory)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        with self.memory.atomic():
            yield

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        with self.memory.atomic():
            yield

    def read(self, row_id: int) -> StoredMessage:
        return self.memory.rows[row_id]

    def rows(self) -> list[StoredMessage]:
        return list(self.memory.rows.values())

    def clear(self) -> None:
        self.memory.rows.clear()
        self.memory.letters.clear()
        self.memory.deliveries.clear()
        self.memory.completions.clear()
        self.memory.workflows.clear()
        self.memory.joins.clear()
        self.memory.last_sweep_at = None


class SQLAlchemyHarness(Harness):
    """``celery_outbox.sqlalchemy.SQLAlchemyOutboxStore`` with ``Session`` transactions."""

    def __init__(self, engine: Any) -> None:
        from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore

        self.engine = engine
        self.sa_store = SQLAlchemyOutboxStore(engine=engine)
        self._session: Any = None
        super().__init__(self.sa_store)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        from sqlalchemy.orm import Session

        with Session(self.engine) as session, session.begin(), self.sa_store.bind_session(session):
            self._session = session
            yield

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        with self._session.begin_nested():
            yield

    def read(self, row_id: int) -> StoredMessage:
        from sqlalchemy import select

        table = self.sa_store.tables.outbox
        with self.engine.connect() as conn:
            row = conn.execute(select(table).where(table.c.id == row_id)).mappings().one()
        return stored_message(row)

    def rows(self) -> list[StoredMessage]:
        from sqlalchemy import select

        with self.engine.connect() as conn:
            found = conn.execute(select(self.sa_store.tables.outbox)).mappings().all()
        return [stored_message(row) for row in found]

    def clear(self) -> None:
        with self.engine.begin() as conn:
            for table in self.sa_store.tables:
                conn.execute(table.delete())


class DjangoHarness(Harness):
    """``django_outbox.store.DjangoOutboxStore`` with ``transaction.atomic``."""

    def __init__(self) -> None:
        from django_outbox.store import DjangoOutboxStore

        super().__init__(DjangoOutboxStore())

    @contextmanager
    def transaction(self) -> Iterator[None]:
        from django.db import transaction

        with transaction.atomic():
            yield

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        from django.db import transaction

        with transaction.atomic():
            yield

    def read(self, row_id: int) -> StoredMessage:
        from django_outbox.models import OutboxMessage

        return stored_message(OutboxMessage.objects.get(pk=row_id))

    def rows(self) -> list[StoredMessage]:
        from django_outbox.models import OutboxMessage

        return [stored_message(row) for row in OutboxMessage.objects.all()]

    def clear(self) -> None:
        from django.apps import apps

        for model in apps.get_app_config("django_outbox").get_models():
            if model._meta.managed and not model._meta.proxy:
                model._default_manager.all().delete()

    def settle(self) -> None:
        """Run the published rows' deletes the on-commit publisher handed to a thread."""
        from django_outbox.store.transactions import settle

        assert settle()

    def in_thread(self, work: Callable[[], T]) -> T:
        from django.db import connections

        try:
            return work()
        finally:
            connections.close_all()
