"""The admin's overview page in a real browser at 1280 x 800: Playwright driving Debian's
chromium, headless, against a live server on real PostgreSQL (the fixtures of
``test_admin_browser.py``; skipped like it without Playwright or chromium).

A superuser reads the figures and both charts, requeues one group and discards another
through their confirmation pages, and backs out of a third; a user without the
permissions sees no button and a POST forged in the page (with a valid CSRF token) is
refused; a POST without the token is refused; a message holding ``<script>`` renders as
text. The page's screenshot goes to ``docs/images/admin-overview.png``, its group
confirmation's to ``admin-overview-confirm.png`` (docs/operations.md shows them).

As in ``test_admin_browser.py``, rows are prepared before the browser opens and checked
after it closes (Django refuses ORM calls while Playwright's loop runs).
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest

from celery_outbox.clock import utcnow
from celery_outbox.config import OutboxConfig
from celery_outbox.state import state_of
from celery_outbox.store.records import DeadLetterStatus, MessageStatus
from django_outbox.models import DeadLetter, OutboxMessage, SweepRecord, Workflow
from tests.django import admin_app
from tests.django.admin import test_browser as browser
from tests.django.admin.test_browser import INJECTED_NODES, PASSWORD, XSS, browser_page, make_user
from tests.django.admin_app import APP_PATH, OTHER, make_letter
from tests.django.celery_app import RECORD
from tests.worker import REPO_ROOT

if TYPE_CHECKING:
    from playwright.sync_api import Dialog

#: The browser tests' fixtures: skip without a browser; the live server with the admin's CSS.
_browser_available = browser._browser_available
admin_server = browser.admin_server

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

OVERVIEW_PATH = "/admin/django_outbox/overview/"
WIDTH, HEIGHT = 1280, 800
#: The screenshots docs/operations.md shows.
SCREENSHOT = REPO_ROOT / "docs" / "images" / "admin-overview.png"
CONFIRM_SCREENSHOT = REPO_ROOT / "docs" / "images" / "admin-overview-confirm.png"
DECLINED = "shop.PaymentDeclined"
TIMEOUT = "requests.exceptions.ReadTimeout"
#: POSTs a group action from inside the page with the page's CSRF token; the status.
FORGED_POST = """async ([url, task, exception, upto]) => {
    const token = document.cookie.split('; ').find(c => c.startsWith('csrftoken=')).split('=')[1];
    const body = new URLSearchParams({task, exception, upto, confirmed: 'yes',
                                      csrfmiddlewaretoken: token});
    const response = await fetch(url, {method: 'POST', body});
    return response.status;
}"""
#: The same POST without any CSRF token.
TOKENLESS_POST = """async ([url, task, exception, upto]) => {
    const body = new URLSearchParams({task, exception, upto, confirmed: 'yes'});
    const response = await fetch(url, {method: 'POST', body});
    return response.status;
}"""


@pytest.fixture(autouse=True)
def _outbox_app(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Requeue through the test app, which keeps published rows for a day (the chart)."""
    settings.DJANGO_OUTBOX_CELERY_APP = APP_PATH
    state = state_of(admin_app.app)
    kept = replace(OutboxConfig.from_celery(admin_app.app), keep_published=timedelta(days=1))
    monkeypatch.setattr(state, "config", kept)


def seed() -> dict[str, list[int]]:
    """A day of activity: published rows and dead letters over the last hours, parked
    retries, a failed row, a sweep, workflows; the ids of each group's letters.
    """
    now = utcnow()
    rows = []
    for hour in range(24):
        for n in range((hour * 7) % 11 + 2):
            due = now - timedelta(hours=hour, minutes=n)
            rows.append(_row(MessageStatus.PUBLISHED.value, due, published_at=due))
    for n in range(4):
        rows.append(_row(MessageStatus.PENDING.value, now + timedelta(minutes=20 * (n + 1))))
    rows.append(_row(MessageStatus.FAILED.value, now - timedelta(hours=2)))
    OutboxMessage.objects.bulk_create(rows)
    SweepRecord.objects.create(name="sweep", last_sweep_at=now - timedelta(seconds=3))
    for n, status in enumerate(["running"] * 3 + ["succeeded"] * 9 + ["failed"]):
        Workflow.objects.create(
            root_id=str(uuid.uuid4()),
            name="shop.checkout",
            status=status,
            steps_total=3,
            steps_done=3 if status == "succeeded" else 1,
            created_at=now - timedelta(minutes=n),
        )
    groups: dict[str, list[int]] = {DECLINED: [], TIMEOUT: [], "xss": []}
    for n in range(6):
        groups[DECLINED].append(_letter(now - timedelta(hours=n * 3), DECLINED, f"card {n}"))
    for n in range(3):
        groups[TIMEOUT].append(_letter(now - timedelta(hours=n * 5 + 1), TIMEOUT, "read timeout"))
    groups["xss"].append(_letter(now - timedelta(hours=7), "builtins.ValueError", XSS, OTHER))
    return groups


def _row(status: str, due: Any, published_at: Any = None) -> OutboxMessage:
    retries = {"headers": {"retries": 3}} if status == MessageStatus.PENDING.value else {}
    return OutboxMessage(
        task_id=str(uuid.uuid4()),
        task_name=RECORD,
        payload="[[], {}, {}]",
        options=retries,
        status=status,
        available_at=due,
        published_at=published_at,
    )


def _letter(failed_at: Any, exception_type: str, message: str, task: str = RECORD) -> int:
    letter = make_letter(
        exception_type=exception_type,
        exception_message=message,
        failed_at=failed_at,
        first_failed_at=failed_at - timedelta(minutes=5),
        task_name=task,
    )
    return int(letter.pk)


def log_in(page: Any, username: str) -> None:
    page.set_viewport_size({"width": WIDTH, "height": HEIGHT})
    page.goto("/admin/login/?next=" + OVERVIEW_PATH)
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url("**" + OVERVIEW_PATH)


def group_row(page: Any, exception_type: str) -> Any:
    return page.locator("tr.outbox-group", has_text=exception_type)


def statuses(ids: list[int]) -> set[str]:
    return set(DeadLetter.objects.filter(pk__in=ids).values_list("status", flat=True))


def test_a_superuser_reads_the_page_and_acts_on_groups(admin_server: str) -> None:
    make_user("root", superuser=True)
    groups = seed()
    dialogs: list[str] = []

    with browser_page(admin_server) as page:

        def record_dialog(dialog: Dialog) -> None:
            dialogs.append(dialog.message)
            dialog.dismiss()

        page.on("dialog", record_dialog)
        log_in(page, "root")
        figures = {
            name: page.locator(f"#outbox-{name}").inner_text()
            for name in ("pending", "parked", "failed", "due")
        }
        sweep = page.locator("#outbox-sweep").inner_text()
        charts = page.locator("svg.outbox-chart")
        chart_count = charts.count()
        bars = [charts.nth(i).locator("rect").count() for i in range(chart_count)]
        tooltips = page.eval_on_selector_all(
            "svg.outbox-chart rect title", "titles => titles.map(t => t.textContent)"
        )
        groups_text = page.locator("#outbox-groups").inner_text()
        parked_rows = page.locator("#outbox-parked-next tbody tr").count()
        injected = page.evaluate("() => window.__xss")
        injected_nodes = page.evaluate(INJECTED_NODES)
        page_width = page.evaluate("() => document.documentElement.scrollWidth")
        page.screenshot(path=str(SCREENSHOT), full_page=True)

        group_row(page, TIMEOUT).locator("button.outbox-discard-group").click()
        page.wait_for_url("**/group/discard/")
        page.get_by_role("link", name="No, take me back").click()
        page.wait_for_url("**" + OVERVIEW_PATH)

        group_row(page, DECLINED).locator("button.outbox-requeue-group").click()
        page.wait_for_url("**/group/requeue/")
        confirm_text = page.locator("#content").inner_text()
        page.screenshot(path=str(CONFIRM_SCREENSHOT), full_page=True)
        page.click("#outbox-confirm")
        page.wait_for_url("**" + OVERVIEW_PATH)
        requeued_message = page.locator(".messagelist .success").inner_text()

        group_row(page, TIMEOUT).locator("button.outbox-discard-group").click()
        page.wait_for_url("**/group/discard/")
        page.click("#outbox-confirm")
        page.wait_for_url("**" + OVERVIEW_PATH)
        discarded_message = page.locator(".messagelist .success").inner_text()
        groups_left = page.locator("tr.outbox-group").count()

    assert figures == {"pending": "4", "parked": "4", "failed": "1", "due": "0"}
    assert page_width <= WIDTH  # readable at 1280 x 800 without scrolling sideways
    assert "ago" in sweep
    assert bars == [24, 24]  # publishes, then dead letters: one bar per hour
    assert any(t.endswith(" published") for t in tooltips)
    assert any(t.endswith(": 1 dead letters") for t in tooltips)
    assert "PaymentDeclined" in groups_text
    assert parked_rows == 4
    assert dialogs == []
    assert injected is None
    assert injected_nodes == 0
    assert "<script>window.__xss = 1;" in groups_text
    assert "6 of them" in confirm_text
    assert requeued_message == "6 dead letters were requeued."
    assert discarded_message == "3 dead letters were discarded."
    assert groups_left == 1  # the <script> one
    assert statuses(groups[DECLINED]) == {DeadLetterStatus.REQUEUED.value}
    assert statuses(groups[TIMEOUT]) == {DeadLetterStatus.DISCARDED.value}
    assert statuses(groups["xss"]) == {DeadLetterStatus.DEAD.value}


def test_without_the_permissions_no_button_and_a_forged_post_is_refused(
    admin_server: str,
) -> None:
    make_user("viewer", "view_deadletter")
    make_user("requeuer", "view_deadletter", "requeue_deadletter")
    make_user("root", superuser=True)
    letter_id = _letter(utcnow(), DECLINED, "declined")
    group = [RECORD, DECLINED, str(letter_id)]
    requeue_url = OVERVIEW_PATH + "group/requeue/"
    discard_url = OVERVIEW_PATH + "group/discard/"

    with browser_page(admin_server) as page:
        log_in(page, "viewer")
        viewer_buttons = page.locator("#outbox-groups button").count()
        viewer_requeue = page.evaluate(FORGED_POST, [requeue_url, *group])
        viewer_discard = page.evaluate(FORGED_POST, [discard_url, *group])
        page.context.clear_cookies()
        log_in(page, "requeuer")
        requeuer_buttons = page.eval_on_selector_all(
            "#outbox-groups button", "buttons => buttons.map(b => b.textContent)"
        )
        requeuer_discard = page.evaluate(FORGED_POST, [discard_url, *group])
        page.context.clear_cookies()
        log_in(page, "root")
        tokenless = page.evaluate(TOKENLESS_POST, [requeue_url, *group])

    assert viewer_buttons == 0
    assert (viewer_requeue, viewer_discard) == (403, 403)
    assert requeuer_buttons == ["Requeue group"]
    assert requeuer_discard == 403
    assert tokenless == 403  # CSRF
    assert statuses([letter_id]) == {DeadLetterStatus.DEAD.value}
