"""What the outbox holds for each Celery app, in one typed object, and how to forget it.

Each app has one :class:`AppState`: its validated settings, its store, its relay and the
unconnected connection dispatch captures messages with. Everything else reads them
through :func:`celery_outbox.registry.store_for`, :func:`celery_outbox.relay.relay.relay_for`
and :meth:`celery_outbox.config.OutboxConfig.from_celery`.

Where an app's store comes from, first match wins:

1. the store given to :func:`celery_outbox.install_store` for that app;
2. the store the ``outbox_store`` setting builds (once, on first use);
3. the process default store (:func:`celery_outbox.registry.set_default_store`; the
   ``django_outbox`` app sets its ORM store there in ``ready()``).

:func:`reset` forgets an app's state (closing its relay), so that the next use reads the
settings again: tests that change ``app.conf`` call it instead of poking at the app.

The state lives in one attribute of the app rather than in a weak mapping keyed by the
app: the relay refers to its app, so a weak mapping's value would keep its key (and its
broker connections) alive for ever, while an attribute dies with the app.

This module sits below everything that fills the state (settings, relay, dispatch), so
it names their types only as far as it must: ``config`` and ``relay`` are narrowed with
``isinstance`` by their owners (:mod:`celery_outbox.config`, :mod:`celery_outbox.registry`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Protocol

from celery import Celery
from kombu import Connection

from celery_outbox.store.base import OutboxStore

#: The one attribute of a Celery app the outbox sets (nothing else reads or writes it).
_SLOT = "_celery_outbox_state"
_create_lock = threading.Lock()
_default_store: OutboxStore | None = None


class Closable(Protocol):
    """What :func:`reset` needs of a relay."""

    def close(self) -> None:
        """Close its broker connections."""


@dataclass(eq=False)
class AppState:
    """The outbox's state for one Celery app (all fields filled lazily)."""

    #: The validated ``outbox_*`` settings, an ``OutboxConfig`` (read on first use).
    config: object | None = None
    #: The installed store, or the one ``outbox_store`` built (not the default store).
    store: OutboxStore | None = None
    #: The ``Relay`` publishing through ``store`` (rebuilt when the store changes).
    relay: Closable | None = None
    #: Never connected: Celery's ``apply_async`` only needs one to build a message.
    capture_connection: Connection | None = None
    #: Serialises building the store from ``outbox_store``.
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


def state_of(app: Celery) -> AppState:
    """The state of ``app`` (created empty on first use)."""
    state: AppState | None = vars(app).get(_SLOT)
    if state is None:
        with _create_lock:
            state = vars(app).get(_SLOT)
            if state is None:
                state = AppState()
                setattr(app, _SLOT, state)
    return state


def reset(app: Celery) -> None:
    """Forget everything the outbox holds for ``app``, closing its relay.

    The next use reads the ``outbox_*`` settings again and builds the store named by
    ``outbox_store`` again; a store given to :func:`celery_outbox.install_store` is
    forgotten too (install it again). The process default store is kept.
    """
    state: AppState | None = vars(app).pop(_SLOT, None)
    if state is not None and state.relay is not None:
        state.relay.close()


def set_default_store(store: OutboxStore | None) -> None:
    """Install the store every app without one of its own uses (Django does this)."""
    global _default_store
    _default_store = store


def default_store() -> OutboxStore | None:
    """The process default store, if one was set."""
    return _default_store
