"""The dead-letter admin in a real browser: Playwright driving Debian's chromium, headless.

Against pytest-django's ``live_server`` on real PostgreSQL, with a real Redis broker and a
real worker: a superuser filters dead letters, requeues two, sees the success message,
and the worker runs both again; a staff user without the requeue permission is not
offered the action; a dead letter whose args hold ``<script>`` renders as text.

Skipped when Playwright or ``/usr/bin/chromium`` (``OUTBOX_TEST_CHROMIUM``) is missing, unless
``OUTBOX_REQUIRE_SERVICES=1`` (CI), where that is a failure. Install them with
``pip install playwright`` and ``apt-get install -y chromium`` (never ``playwright install``:
the test launches the system chromium).

Playwright's sync API runs an event loop while a browser is open, and Django refuses ORM
calls from a thread with a running loop; so every test prepares its rows before opening
the browser and checks the database after closing it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from django.contrib.auth.models import Permission, User

from celery_outbox.store.records import DeadLetterStatus
from django_outbox.models import DeadLetter
from tests import services
from tests.django import admin_app
from tests.django.admin_app import APP_PATH, make_letter
from tests.django.celery_app import RECORD
from tests.django.conftest import World
from tests.worker import WorkerProcess

if TYPE_CHECKING:
    from playwright.sync_api import Dialog, ViewportSize

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.parametrize("broker_url", ["redis"], indirect=True),
]

#: The browser the test drives (Debian's package, not Playwright's download).
CHROMIUM = os.environ.get("OUTBOX_TEST_CHROMIUM", "/usr/bin/chromium")
#: Flags for a headless chromium in a container, without background traffic.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
#: Wide enough for every changelist column.
VIEWPORT: ViewportSize = {"width": 1600, "height": 1000}
#: Where the screenshot of the requeue result goes.
SCREENSHOT = Path("/tmp/admin.png")
#: Where the screenshot of the escaped detail page goes.
DETAIL_SCREENSHOT = Path("/tmp/admin-detail.png")
PASSWORD = "pw-for-browser-tests"
XSS = "<script>window.__xss = 1; alert('xss')</script><img src=x onerror=\"alert('img')\">"
DECLINED = "shop.PaymentDeclined"
LETTERS_PATH = "/admin/django_outbox/deadletter/"
#: Counts elements the payload would have created had it been parsed as HTML.
INJECTED_NODES = """() => document.querySelectorAll('img[src="x"]').length
    + [...document.scripts].filter(s => s.textContent.includes('__xss')).length"""


def require_browser() -> None:
    """Skip (or, with ``OUTBOX_REQUIRE_SERVICES=1``, fail) without Playwright or chromium."""
    missing = []
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the playwright package (pip install playwright)")
    if not Path(CHROMIUM).is_file():
        missing.append(f"{CHROMIUM} (apt-get install -y chromium)")
    if not missing:
        return
    reason = "browser test needs " + " and ".join(missing)
    if services.services_required():
        pytest.fail(f"{services.REQUIRE_ENV}=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@contextlib.contextmanager
def browser_page(base_url: str, *, javascript: bool = True) -> Iterator[Any]:
    """A fresh page of a headless chromium (``javascript=False``: with JavaScript off);
    no ORM calls while it is open.
    """
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            context = browser.new_context(
                base_url=base_url, viewport=VIEWPORT, java_script_enabled=javascript
            )
            context.set_default_timeout(15_000)
            yield context.new_page()
        finally:
            browser.close()


def log_in(page: Any, username: str, next_path: str = LETTERS_PATH) -> None:
    """Log in through the admin's login form, which then opens ``next_path``."""
    page.goto("/admin/login/?next=" + next_path)
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url("**" + next_path)


def action_names(page: Any) -> list[str]:
    """The values of the changelist's action menu (empty when there is no menu)."""
    if page.locator("select[name=action]").count() == 0:
        return []
    values: list[str] = page.eval_on_selector_all(
        "select[name=action] option", "options => options.map(o => o.value)"
    )
    return [value for value in values if value]


def make_user(name: str, *perms: str, superuser: bool = False) -> User:
    """A staff user with a password and ``perms`` (codenames of ``django_outbox``)."""
    user: User = User.objects.create_user(
        name, password=PASSWORD, is_staff=True, is_superuser=superuser
    )
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="django_outbox", codename__in=perms)
    )
    return user


@pytest.fixture(autouse=True)
def _browser_available() -> None:
    """Skip or fail before anything starts when there is no browser to drive."""
    require_browser()


@pytest.fixture
def admin_server(transactional_db: None, settings: Any, tmp_path: Path) -> Iterator[str]:
    """URL of a live server (pytest-django's ``LiveServer``) serving the admin with its
    static files and django_outbox's.

    Not the ``live_server`` fixture itself: ``tests/django_settings.py`` has no
    ``STATIC_URL`` and no ``django.contrib.staticfiles``, and the static handler
    ``live_server`` then installs fails every request (``STATIC_URL=None``). Here a
    ``STATIC_ROOT`` links the two apps' static directories, as ``collectstatic`` would
    gather them.
    """
    import django.contrib.admin
    from pytest_django.live_server_helper import LiveServer

    import django_outbox

    for app in (django.contrib.admin, django_outbox):
        for found in (Path(app.__file__).parent / "static").iterdir():
            (tmp_path / found.name).symlink_to(found, target_is_directory=True)
    settings.STATIC_URL = "/static/"
    settings.STATIC_ROOT = str(tmp_path)
    server = LiveServer("localhost")
    yield server.url
    server.stop()


@pytest.fixture
def browser_world(world: World, settings: Any, monkeypatch: pytest.MonkeyPatch) -> World:
    """The admin requeues through ``world``'s app (real broker, the worker's queue)."""
    settings.DJANGO_OUTBOX_CELERY_APP = APP_PATH
    monkeypatch.setattr(admin_app, "app", world.app)
    return world


def test_superuser_filters_requeues_two_and_the_worker_runs_them(
    browser_world: World, admin_server: str, start_worker: Callable[..., WorkerProcess]
) -> None:
    make_user("root", superuser=True)
    options = {"queue": browser_world.queue}
    declined = [
        make_letter(
            exception_type=DECLINED,
            exception_message=f"card {n} declined",
            args=[None],
            options=options,
        )
        for n in (1, 2)
    ]
    other = make_letter(exception_type="builtins.KeyError", options=options)
    start_worker()

    with browser_page(admin_server) as page:
        log_in(page, "root")
        assert page.locator("#result_list tbody tr").count() == 3
        page.get_by_role("link", name=DECLINED, exact=True).click()
        page.wait_for_url("**exception_type=" + DECLINED + "*")
        rows = page.locator("#result_list tbody tr")
        assert rows.count() == 2
        for index in range(2):
            rows.nth(index).locator("input[name=_selected_action]").check()
        page.select_option("select[name=action]", "requeue_selected")
        page.click("button[name=index]")
        success = page.locator(".messagelist .success")
        success.wait_for()
        assert success.inner_text() == "2 dead letters were requeued."
        page.screenshot(path=str(SCREENSHOT), full_page=True)
        runs = browser_world.wait_for_runs(2, timeout=30)

    requeued = DeadLetter.objects.filter(pk__in=[d.pk for d in declined])
    assert {d.status for d in requeued} == {DeadLetterStatus.REQUEUED.value}
    assert {d.requeued_by for d in requeued} == {"root"}
    assert sorted(run["task_id"] for run in runs) == sorted(d.requeued_task_id for d in requeued)
    other.refresh_from_db()
    assert other.status == DeadLetterStatus.DEAD.value


def test_staff_without_requeue_permission_has_no_requeue_action(
    browser_world: World, admin_server: str
) -> None:
    make_user("viewer", "view_deadletter", "discard_deadletter")
    make_user("operator", "view_deadletter", "requeue_deadletter")
    make_letter()

    with browser_page(admin_server) as page:
        log_in(page, "viewer")
        viewer_actions = action_names(page)
        page.context.clear_cookies()
        log_in(page, "operator")
        operator_actions = action_names(page)

    assert viewer_actions == ["discard_selected"]
    assert operator_actions == ["requeue_selected"]


def test_script_in_args_renders_as_text(browser_world: World, admin_server: str) -> None:
    make_user("root", superuser=True)
    letter = make_letter(args=[XSS], kwargs={"note": XSS}, exception_message=XSS, task_name=RECORD)
    dialogs: list[str] = []

    with browser_page(admin_server) as page:

        def record_dialog(dialog: Dialog) -> None:
            dialogs.append(dialog.message)
            dialog.dismiss()

        page.on("dialog", record_dialog)
        log_in(page, "root")
        list_text = page.locator("#result_list").inner_text()
        page.goto(f"/admin/django_outbox/deadletter/{letter.pk}/change/")
        detail_text = page.locator("#content").inner_text()
        injected = page.evaluate("() => window.__xss")
        injected_nodes = page.evaluate(INJECTED_NODES)
        page.screenshot(path=str(DETAIL_SCREENSHOT), full_page=True)

    assert dialogs == []
    assert injected is None
    assert injected_nodes == 0
    assert "<script>window.__xss = 1; alert('xss')</script>" in list_text
    assert detail_text.count("<script>window.__xss = 1;") >= 3  # args, kwargs, message
