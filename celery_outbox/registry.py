"""Which store a Celery app uses: see :mod:`celery_outbox.state` for the order.

The relay of an app (``relay_for``) lives with the relay
(:func:`celery_outbox.relay.relay.relay_for`); its old name here still works, with a warning.
"""

from __future__ import annotations

import importlib
import inspect
import warnings
from typing import Any

from celery import Celery
from kombu.utils.imports import symbol_by_name

from celery_outbox.config import OutboxConfig
from celery_outbox.exceptions import NoStoreConfigured, OutboxConfigError
from celery_outbox.state import default_store, set_default_store, state_of
from celery_outbox.store.base import OutboxStore

__all__ = ["install_store", "load_store", "set_default_store", "store_for"]

#: What ``outbox_store`` accepts, for error messages.
_ACCEPTED = (
    "Give the dotted path of a callable taking the Celery app and returning an "
    "OutboxStore (such as 'proj.outbox.make_store'), or of an OutboxStore class with a "
    "from_celery(app) classmethod or no required argument."
)


def install_store(app: Celery, store: OutboxStore) -> None:
    """Make ``store`` the outbox store of ``app`` (before ``outbox_store`` and the default)."""
    state = state_of(app)
    state.store = store
    state.relay = None


def store_for(app: Celery) -> OutboxStore:
    """The store of ``app``: installed, built from ``outbox_store``, or the default.

    Raises
    ------
    NoStoreConfigured
        When there is none.
    OutboxConfigError
        When ``outbox_store`` names no usable factory.
    """
    state = state_of(app)
    if state.store is not None:
        return state.store
    path = OutboxConfig.from_celery(app).store
    if path is not None:
        with state.lock:
            if state.store is None:
                state.store = load_store(path, app)
        return state.store
    store = default_store()
    if store is None:
        raise NoStoreConfigured()
    return store


def load_store(path: str, app: Celery) -> OutboxStore:
    """The store ``outbox_store=path`` builds for ``app`` (also run by Django's check).

    ``path`` names a callable taking the app (``make_store(app)``); an
    :class:`OutboxStore` class is built with ``from_celery(app)`` when it has that
    classmethod, else with no argument.

    Raises
    ------
    OutboxConfigError
        Naming the setting, when ``path`` cannot be imported, building the store fails
        (the cause chained), or it gives no :class:`OutboxStore`.
    """
    try:
        factory = symbol_by_name(path)
    except (ImportError, AttributeError, ValueError) as exc:
        raise OutboxConfigError(
            f"outbox_store={path!r} cannot be imported: {exc}. {_ACCEPTED}"
        ) from exc
    try:
        store = _build(factory, app)
    except Exception as exc:  # any failure of user code: name the setting, chain the cause
        raise OutboxConfigError(
            f"outbox_store={path!r} could not be built ({type(exc).__name__}: {exc}). {_ACCEPTED}"
        ) from exc
    if not isinstance(store, OutboxStore):
        raise OutboxConfigError(
            f"outbox_store={path!r} gave {type(store).__name__}, not an OutboxStore. {_ACCEPTED}"
        )
    return store


def _build(factory: Any, app: Celery) -> Any:
    if inspect.isclass(factory):
        from_celery = getattr(factory, "from_celery", None)
        return from_celery(app) if callable(from_celery) else factory()
    if not callable(factory):
        raise TypeError(f"{type(factory).__name__} is not callable")
    return factory(app)


_warned: set[str] = set()


def __getattr__(name: str) -> Any:
    """``relay_for``, moved to :mod:`celery_outbox.relay.relay`: found there, warning once."""
    if name != "relay_for":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _warned:
        _warned.add(name)
        warnings.warn(
            "celery_outbox.registry.relay_for moved to celery_outbox.relay.relay.relay_for: "
            "import it from there.",
            DeprecationWarning,
            stacklevel=2,
        )
    return importlib.import_module("celery_outbox.relay.relay").relay_for
