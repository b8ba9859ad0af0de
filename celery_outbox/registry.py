"""Which store (and relay) a Celery app uses."""

from __future__ import annotations

import threading

from celery import Celery
from kombu.utils.imports import symbol_by_name

from celery_outbox.config import OutboxConfig
from celery_outbox.exceptions import NoStoreConfigured, OutboxConfigError
from celery_outbox.relay import Relay
from celery_outbox.storage import OutboxStore

_lock = threading.Lock()
_default_store: OutboxStore | None = None


def set_default_store(store: OutboxStore | None) -> None:
    """Install the store every app without one of its own uses (Django does this)."""
    global _default_store
    _default_store = store


def install_store(app: Celery, store: OutboxStore) -> None:
    """Make ``store`` the outbox store of ``app`` (and drop its cached relay)."""
    app._outbox_store = store  # type: ignore[attr-defined]
    app._outbox_relay = None  # type: ignore[attr-defined]


def store_for(app: Celery) -> OutboxStore:
    """The store of ``app``: installed, named by ``outbox_store``, or the default.

    Raises
    ------
    NoStoreConfigured
        When there is none.
    """
    store: OutboxStore | None = getattr(app, "_outbox_store", None)
    if store is not None:
        return store
    path = OutboxConfig.from_celery(app).store
    if path is not None:
        with _lock:
            if getattr(app, "_outbox_store", None) is None:
                install_store(app, load_store(path, app))
        return app._outbox_store  # type: ignore[attr-defined,no-any-return]
    if _default_store is None:
        raise NoStoreConfigured()
    return _default_store


def relay_for(app: Celery) -> Relay:
    """The relay publishing ``app``'s rows through its store (one per app and store)."""
    store = store_for(app)
    relay: Relay | None = getattr(app, "_outbox_relay", None)
    if relay is None or relay.store is not store:
        relay = Relay(app, store=store, config=OutboxConfig.from_celery(app))
        app._outbox_relay = relay  # type: ignore[attr-defined]
    return relay


def load_store(path: str, app: Celery) -> OutboxStore:
    """The store ``outbox_store=path`` gives for ``app`` (also run by Django's check).

    Raises
    ------
    OutboxConfigError
        When ``path`` cannot be imported, cannot be called as documented, or does not
        give an :class:`OutboxStore`.
    """
    try:
        factory = symbol_by_name(path)
    except (ImportError, AttributeError, ValueError) as exc:
        raise OutboxConfigError(
            f"outbox_store={path!r} cannot be imported: {exc}. Give the dotted path of an "
            "OutboxStore subclass, or of a callable taking the Celery app and returning one."
        ) from exc
    try:
        store = factory.from_celery(app) if hasattr(factory, "from_celery") else factory()
    except (TypeError, ValueError) as exc:
        raise OutboxConfigError(
            f"outbox_store={path!r} could not be built ({exc}): give a class with a "
            "from_celery(app) classmethod or no required argument, or a factory function."
        ) from exc
    if not isinstance(store, OutboxStore):
        raise OutboxConfigError(
            f"outbox_store={path!r} gave {type(store).__name__}, not an OutboxStore."
        )
    return store
