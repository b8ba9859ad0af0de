"""Where an app's store comes from and the ``outbox_store`` factory protocol (what
``reset`` forgets: ``test_state.py``).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
from celery import Celery

from celery_outbox import OutboxConfigError
from celery_outbox.exceptions import NoStoreConfigured
from celery_outbox.registry import install_store, load_store, store_for
from celery_outbox.relay.relay import relay_for
from celery_outbox.state import default_store, reset, set_default_store
from celery_outbox.testing import InMemoryOutboxStore
from tests.unit.store_factories import AppStore

FACTORIES = "tests.unit.store_factories"


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("registry-unit", broker="memory://", set_as_current=False)
    yield app
    reset(app)
    app.close()


@pytest.fixture
def no_default() -> Iterator[None]:
    default = default_store()  # pytest-django set up django_outbox, which sets one
    set_default_store(None)
    yield
    set_default_store(default)


def test_a_factory_is_called_with_the_app(app: Celery) -> None:
    # Before: the loader called it with no argument, and the setting never worked.
    store = load_store(f"{FACTORIES}.make_store", app)
    assert isinstance(store, AppStore)
    assert store.app is app


def test_a_class_is_built_with_from_celery(app: Celery) -> None:
    store = load_store(f"{FACTORIES}.AppStore", app)
    assert isinstance(store, AppStore)
    assert store.app is app


def test_a_class_without_from_celery_is_built_with_no_argument(app: Celery) -> None:
    store = load_store("celery_outbox.testing.InMemoryOutboxStore", app)
    assert isinstance(store, InMemoryOutboxStore)


@pytest.mark.parametrize(
    ("target", "says", "cause"),
    [
        ("broken", "could not be built (KeyError", KeyError),
        ("NOT_CALLABLE", "could not be built (TypeError: int is not callable)", TypeError),
    ],
)
def test_a_failing_factory_is_a_config_error_naming_the_setting(
    app: Celery, target: str, says: str, cause: type[Exception]
) -> None:
    path = f"{FACTORIES}.{target}"
    with pytest.raises(OutboxConfigError) as caught:
        load_store(path, app)
    assert f"outbox_store={path!r} {says}" in str(caught.value)
    assert "callable taking the Celery app" in str(caught.value)
    assert isinstance(caught.value.__cause__, cause)


def test_the_sqlalchemy_store_class_alone_is_a_config_error(app: Celery) -> None:
    # It needs an engine: the error says so and how to give one, never a raw TypeError.
    path = "celery_outbox.sqlalchemy.SQLAlchemyOutboxStore"
    with pytest.raises(OutboxConfigError, match=r"could not be built.*engine") as caught:
        load_store(path, app)
    assert isinstance(caught.value.__cause__, TypeError)


def test_the_setting_builds_the_store_once(app: Celery) -> None:
    app.conf.outbox_store = f"{FACTORIES}.make_store"
    store = store_for(app)
    assert isinstance(store, AppStore)
    assert store_for(app) is store


def test_an_installed_store_comes_before_the_setting_and_the_default(app: Celery) -> None:
    app.conf.outbox_store = f"{FACTORIES}.make_store"
    mine = InMemoryOutboxStore()
    install_store(app, mine)
    assert store_for(app) is mine


def test_the_setting_comes_before_the_default(app: Celery) -> None:
    app.conf.outbox_store = f"{FACTORIES}.make_store"
    assert isinstance(store_for(app), AppStore)


def test_the_default_store_comes_last(app: Celery, no_default: None) -> None:
    with pytest.raises(NoStoreConfigured):
        store_for(app)
    default = InMemoryOutboxStore()
    set_default_store(default)
    assert store_for(app) is default


def test_install_store_drops_the_relay_of_the_previous_store(app: Celery) -> None:
    install_store(app, InMemoryOutboxStore())
    first = relay_for(app)
    second_store = InMemoryOutboxStore()
    install_store(app, second_store)
    assert relay_for(app) is not first
    assert relay_for(app).store is second_store


def test_relay_for_under_its_old_name_still_works_and_warns_once() -> None:
    from celery_outbox import registry

    registry._warned.clear()
    with pytest.warns(DeprecationWarning, match="moved to celery_outbox.relay.relay.relay_for"):
        old = registry.relay_for
    assert old is relay_for
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert registry.relay_for is relay_for  # once: no second warning
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        registry.nope  # noqa: B018
