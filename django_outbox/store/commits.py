"""Which rows a commit is known to have written, so that its publisher need not read them.

A row a transaction wrote exists once the transaction commits, unless something took it
away before: a savepoint rolled back after the row was written (Django drops that
savepoint's ``on_commit`` callbacks, but a batch's callback registered earlier in an outer
block survives it), a failed statement in a transaction that committed anyway
(``set_rollback(False)``), or the store deleting a pending row in that transaction
(superseding a task id).

So each connection counts the statements that might have done so: every statement naming
``ROLLBACK`` or ``ABORT`` (Django rolls a savepoint back with ``cursor.execute()``, so its
own rollbacks and hand-written ones are seen alike), every statement that raised, and
every superseding insert (:func:`doubt`). A batch notes the count when its first row is
deferred (:func:`watch`); when its on-commit callback runs and the count has not moved,
every row of the batch was committed, and while that callback runs :func:`committed_rows`
names them: the store answers ``still_leased`` for them without a statement. When the
count moved, the rows are read back, as before. A ``ROLLBACK`` sent on the raw DBAPI
connection (``connection.connection.cursor()``) bypasses Django's cursor and is not seen.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

from django_outbox._compat import add_execute_wrapper

#: Attribute of a Django connection holding its :class:`Doubts`.
_DOUBTS_ATTR = "_django_outbox_doubts"
#: Statements that may roll rows back (matched anywhere: a false match only costs a read).
_ROLLBACK = re.compile(r"\b(ROLLBACK|ABORT)\b", re.IGNORECASE)
#: The database alias and the ids of the rows known committed, while their callback runs.
_committed: ContextVar[tuple[str, frozenset[int]]] = ContextVar(
    "django_outbox_committed", default=("", frozenset())
)


class Doubts:
    """An ``execute_wrapper`` counting the statements of one connection that may have
    taken rows away (see the module's docstring)."""

    def __init__(self) -> None:
        #: Grows with each such statement; only its changes mean anything.
        self.count = 0

    def __call__(
        self, execute: Callable[..., Any], sql: Any, params: Any, many: bool, context: Any
    ) -> Any:
        """Run the statement, counting it when it names a rollback or raises."""
        if not isinstance(sql, str) or _ROLLBACK.search(sql):
            self.count += 1  # a composed statement could be anything
        try:
            return execute(sql, params, many, context)
        except BaseException:
            self.count += 1
            raise


def watch(connection: Any) -> Doubts:
    """The :class:`Doubts` of ``connection`` (a Django ``DatabaseWrapper``), installed on
    first use: counting from then on."""
    doubts: Doubts | None = getattr(connection, _DOUBTS_ATTR, None)
    if doubts is None:
        doubts = Doubts()
        add_execute_wrapper(connection, doubts)
        setattr(connection, _DOUBTS_ATTR, doubts)
    return doubts


def doubt(connection: Any) -> None:
    """Some row deferred on ``connection`` may be gone at its commit (the store deleted a
    pending row): the batches open now read their rows back after the commit."""
    doubts: Doubts | None = getattr(connection, _DOUBTS_ATTR, None)
    if doubts is not None:
        doubts.count += 1


@contextlib.contextmanager
def known_committed(alias: str, ids: frozenset[int]) -> Iterator[None]:
    """Within the block, :func:`committed_rows` of ``alias`` names ``ids``."""
    token = _committed.set((alias, ids))
    try:
        yield
    finally:
        _committed.reset(token)


def committed_rows(alias: str) -> frozenset[int]:
    """While a commit's publisher runs: the ids of the rows of database ``alias`` that
    commit is known to have written; else empty."""
    known_alias, ids = _committed.get()
    return ids if known_alias == alias else frozenset()
