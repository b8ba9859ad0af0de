"""The dead-letter, outbox-message and completed-task lists and the dead-letter and
outbox-message pages in a real browser at 1280 x 800:
Playwright driving Debian's chromium, headless, against a live server on real PostgreSQL
(the fixtures of ``test_admin_browser.py``; skipped like it without Playwright or chromium).

Lists: no cell is wrapped into more than three lines (each cell's content height measured
against its line height) and the time columns lie inside the window. Pages: each button
(requeue, discard, publish now, reset, cancel) pressed by a user holding its permission
and absent for one without it; a dead letter's links (its group, its requeued task)
followed; a forged POST (no permission, or no CSRF token, or a GET) refused; ``<script>``
in a payload shown as text. Screenshots go to ``docs/images/``.

As there, rows are prepared before the browser opens and checked after it closes (Django
refuses ORM calls while Playwright's event loop runs).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.models import DELETION, LogEntry

from celery_outbox.clock import utcnow
from celery_outbox.store.records import DeadLetterStatus, MessageStatus
from django_outbox.models import CompletedTask, DeadLetter, OutboxMessage
from tests.django import admin_app
from tests.django.admin import test_browser as browser
from tests.django.admin.test_browser import INJECTED_NODES, XSS, browser_page, make_user
from tests.django.admin_app import APP_PATH, make_letter

#: The browser tests' fixtures: skip without a browser; the live server with the admin's CSS.
_browser_available = browser._browser_available
admin_server = browser.admin_server

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

WIDTH, HEIGHT = 1280, 800
IMAGES = Path(__file__).resolve().parents[3] / "docs" / "images"
LETTERS = "/admin/django_outbox/deadletter/"
MESSAGES = "/admin/django_outbox/outboxmessage/"
COMPLETED = "/admin/django_outbox/completedtask/"
#: Realistic long values: a dotted task path, an exception path, a long message.
TASK = "shop.notifications.tasks.send_order_confirmation_to_customer"
EXCEPTION = "shop.providers.sms.exceptions.ProviderTemporarilyUnavailableError"
MESSAGE = (
    "HTTPSConnectionPool(host='sms.example.com', port=443): Max retries exceeded with url: "
    "/v2/messages (Caused by NewConnectionError('Failed to establish a new connection'))"
)
TRACEBACK = (
    "Traceback (most recent call last):\n"
    + "".join(
        f'  File "/srv/shop/sms.py", line {n}, in send\n    response = session.post(url)\n'
        for n in range(40)
    )
    + f"{EXCEPTION}: {MESSAGE}\n"
)
#: How many lines each cell of ``#result_list`` shows: the height of what the cell holds
#: (its elements' boxes, a clamped one as shown; its text's line boxes) over its line
#: height. The cells of a row share the row's height, so the cell's own box says nothing.
CELL_LINES = """() => [...document.querySelectorAll('#result_list tbody td, #result_list tbody th')]
    .map(cell => {
        let top = Infinity, bottom = -Infinity;
        for (const node of cell.childNodes) {
            let box = null;
            if (node.nodeType === Node.ELEMENT_NODE) box = node.getBoundingClientRect();
            else if (node.textContent.trim()) {
                const range = document.createRange();
                range.selectNodeContents(node);
                box = range.getBoundingClientRect();
            }
            if (box && box.height) {
                top = Math.min(top, box.top);
                bottom = Math.max(bottom, box.bottom);
            }
        }
        const style = getComputedStyle(cell);
        const line = parseFloat(style.lineHeight) || parseFloat(style.fontSize) * 1.2;
        const lines = bottom > top ? Math.round((bottom - top) / line) : 0;
        return {column: cell.className, lines: lines};
    })"""
#: How far the list's table reaches beyond its scrolling container (0: nothing hidden).
HIDDEN = """() => { const box = document.querySelector('.results');
    return box.scrollWidth - box.clientWidth; }"""


@pytest.fixture(autouse=True)
def _outbox_app(settings: Any) -> None:
    settings.DJANGO_OUTBOX_CELERY_APP = APP_PATH


def log_in(page: Any, username: str, next_path: str) -> None:
    """Log in at 1280 x 800 (:func:`tests.django.admin.test_browser.log_in`)."""
    page.set_viewport_size({"width": WIDTH, "height": HEIGHT})
    browser.log_in(page, username, next_path)


def accept_dialogs(page: Any) -> list[str]:
    """Accept every confirmation; the list of their texts."""
    seen: list[str] = []
    page.on("dialog", lambda dialog: (seen.append(dialog.message), dialog.accept()))
    return seen


def widest_cells(page: Any) -> dict[str, int]:
    """The most lines a cell of each column takes."""
    widest: dict[str, int] = {}
    for cell in page.evaluate(CELL_LINES):
        widest[cell["column"]] = max(widest.get(cell["column"], 0), cell["lines"])
    return widest


def column_box(page: Any, column: str) -> dict[str, float]:
    box = page.locator(f"#result_list thead th.column-{column}").bounding_box()
    assert box is not None, column
    return dict(box)


def visible(page: Any, box: dict[str, float]) -> bool:
    """Whether ``box`` lies in the window and in the list's (unscrolled) container."""
    results = page.locator(".results").bounding_box()
    right = min(WIDTH, results["x"] + results["width"])
    return box["x"] >= 0 and box["x"] + box["width"] <= right and box["y"] < HEIGHT


def buttons(page: Any) -> list[str]:
    return [b.strip() for b in page.locator(".outbox-row-actions button").all_inner_texts()]


def csrf_token(page: Any) -> str:
    return str(next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken"))


def pending_row(**fields: Any) -> OutboxMessage:
    """A pending row of the long-named :data:`TASK` (:func:`tests.django.admin_app.pending_row`)."""
    return admin_app.pending_row(**{"task_name": TASK, **fields})


@dataclass(frozen=True)
class ListLayout:
    """How a list page lies in the window (:func:`open_list`)."""

    #: The most lines a cell of each column takes (:func:`widest_cells`).
    widest: dict[str, int]
    #: Whether the list's time column lies in the window.
    shown: bool
    #: How far the table reaches beyond its scrolling container (:data:`HIDDEN`).
    hidden: int
    #: How far the page reaches beyond the window's width.
    overflow: int


def open_list(page: Any, path: str, image: str, time_column: str) -> ListLayout:
    """Log in as ``root`` onto the list at ``path``, screenshot it to ``docs/images/<image>``
    and measure it.
    """
    log_in(page, "root", path)
    page.screenshot(path=str(IMAGES / image))
    return ListLayout(
        widest=widest_cells(page),
        shown=visible(page, column_box(page, time_column)),
        hidden=page.evaluate(HIDDEN),
        overflow=page.evaluate("() => document.documentElement.scrollWidth") - WIDTH,
    )


def assert_readable(layout: ListLayout, columns: int) -> None:
    """``columns`` columns, no cell wrapped into more than three lines, the time column in
    the window, nothing hidden in the container nor beyond the window.
    """
    assert len(layout.widest) == columns, layout.widest
    assert max(layout.widest.values()) <= 3, layout.widest
    assert layout.shown
    assert (layout.hidden, layout.overflow) == (0, 0)


# -- lists ---------------------------------------------------------------------------------
def test_the_dead_letter_list_is_readable_at_1280_by_800(admin_server: str) -> None:
    make_user("root", superuser=True)
    for n in range(12):
        make_letter(task_name=f"{TASK}_{n}", exception_type=EXCEPTION, exception_message=MESSAGE)

    with browser_page(admin_server) as page:
        layout = open_list(page, LETTERS, "admin-dead-letters.png", "failed")
        hover = page.locator("#result_list .field-short_message span").first.get_attribute("title")

    assert_readable(layout, 6)  # the checkbox and five columns
    assert hover == MESSAGE


def test_the_outbox_message_list_is_readable_at_1280_by_800(admin_server: str) -> None:
    make_user("root", superuser=True)
    later = utcnow() + timedelta(hours=2)
    for n in range(6):
        pending_row(task_name=f"{TASK}_{n}", available_at=later)
        pending_row(task_name=TASK, status=MessageStatus.FAILED.value, attempts=20,
                    last_error=f"kombu.exceptions.OperationalError: {MESSAGE}")  # fmt: skip

    with browser_page(admin_server) as page:
        layout = open_list(page, MESSAGES, "admin-outbox-messages.png", "due")

    assert_readable(layout, 6)


def test_the_completed_task_list_is_readable_at_1280_by_800(admin_server: str) -> None:
    make_user("root", superuser=True)
    for n in range(12):
        CompletedTask.objects.create(
            task_id=str(uuid.uuid4()), task_name=f"{TASK}_{n}", completed_at=utcnow(),
            result='{"order": 7, "sent": true}',
        )  # fmt: skip

    with browser_page(admin_server) as page:
        layout = open_list(page, COMPLETED, "admin-completed-tasks.png", "completed")

    assert_readable(layout, 3)  # no actions: three columns


# -- the dead-letter page ------------------------------------------------------------------
def test_requeue_and_discard_buttons(admin_server: str) -> None:
    make_user("root", superuser=True)
    requeue_me = make_letter(args=[XSS], traceback=TRACEBACK)
    discard_me = make_letter()
    target = pending_row(status=MessageStatus.FAILED.value)
    requeued = make_letter(status=DeadLetterStatus.REQUEUED.value, requeued_task_id=target.task_id)

    with browser_page(admin_server) as page:
        confirmations = accept_dialogs(page)
        log_in(page, "root", LETTERS)
        page.goto(f"{LETTERS}{requeue_me.pk}/change/")
        assert buttons(page) == ["Requeue", "Discard"]
        assert page.locator("details.outbox-fold").count() >= 1  # the long traceback
        injected = page.evaluate(INJECTED_NODES)
        page.screenshot(path=str(IMAGES / "admin-dead-letter.png"), full_page=True)
        page.click("a.outbox-group-link")  # the dead letters of its task and exception
        page.wait_for_url("**status__exact=dead**")
        group_rows = page.locator("#result_list tbody tr").count()
        page.go_back()
        page.click(".outbox-row-actions button[name=requeue]")
        page.locator(".messagelist .success").wait_for()
        requeue_note = page.locator(".messagelist").inner_text()
        assert buttons(page) == []  # requeued: nothing left to press
        page.goto(f"{LETTERS}{discard_me.pk}/change/")
        page.click(".outbox-row-actions button[name=discard]")
        page.locator(".messagelist .success").wait_for()
        discard_note = page.locator(".messagelist").inner_text()
        page.goto(f"{LETTERS}{requeued.pk}/change/")
        page.get_by_role("link", name=f"{target.task_id} (outbox message)").click()
        page.wait_for_url(f"**{MESSAGES}{target.pk}/change/")

    assert injected == 0
    assert group_rows == 2  # requeue_me and discard_me (the requeued letter is not dead)
    assert "1 dead letter was requeued." in requeue_note
    assert "1 dead letter was discarded." in discard_note
    assert confirmations == ["Discard this dead letter? It will not be requeued."]
    requeue_me.refresh_from_db()
    discard_me.refresh_from_db()
    assert (requeue_me.status, requeue_me.requeued_by) == ("requeued", "root")
    assert discard_me.status == DeadLetterStatus.DISCARDED.value


def test_dead_letter_buttons_follow_permissions_and_forged_posts_are_refused(
    admin_server: str,
) -> None:
    make_user("viewer", "view_deadletter")
    make_user("requeuer", "view_deadletter", "requeue_deadletter")
    make_user("root", superuser=True)
    letter = make_letter()
    url = f"{LETTERS}{letter.pk}/act/"

    with browser_page(admin_server) as page:
        log_in(page, "viewer", f"{LETTERS}{letter.pk}/change/")
        viewer = buttons(page)
        token = {"csrfmiddlewaretoken": csrf_token(page)}
        forged = [page.request.post(url + name + "/", form=token).status for name in
                  ("requeue", "discard")]  # fmt: skip
        page.context.clear_cookies()
        log_in(page, "requeuer", f"{LETTERS}{letter.pk}/change/")
        requeuer = buttons(page)
        token = {"csrfmiddlewaretoken": csrf_token(page)}
        forged.append(page.request.post(url + "discard/", form=token).status)
        page.context.clear_cookies()
        log_in(page, "root", f"{LETTERS}{letter.pk}/change/")
        no_token = page.request.post(url + "requeue/").status
        as_get = page.request.get(url + "requeue/").status

    assert (viewer, requeuer) == ([], ["Requeue"])
    assert forged == [403, 403, 403]
    assert (no_token, as_get) == (403, 405)
    letter.refresh_from_db()
    assert letter.status == DeadLetterStatus.DEAD.value


# -- the outbox-message page ---------------------------------------------------------------
def test_publish_now_reset_and_cancel_buttons(admin_server: str) -> None:
    make_user("root", superuser=True)
    parked = pending_row(
        available_at=utcnow() + timedelta(hours=1),
        options={
            "content_type": "application/json",
            "headers": {
                "retries": 3,
                "outbox_retry_reason": f"{EXCEPTION}: {XSS}",
                "outbox_first_failed_at": "2026-11-27T10:00:00+00:00",
            },
        },
        payload='[[], {"note": "' + XSS.replace('"', '\\"') + '"}, {}]',
    )
    failed = pending_row(status=MessageStatus.FAILED.value, attempts=20, last_error=XSS)
    publish_me = pending_row(task_name="django_e2e.record", payload='[[], {"user_id": null}, {}]')

    with browser_page(admin_server) as page:
        confirmations = accept_dialogs(page)
        log_in(page, "root", MESSAGES)
        page.goto(f"{MESSAGES}{parked.pk}/change/")
        parked_buttons = buttons(page)
        schedule = page.locator(".field-schedule .readonly").inner_text()
        injected = page.evaluate(INJECTED_NODES)
        page.screenshot(path=str(IMAGES / "admin-outbox-message.png"), full_page=True)
        page.goto(f"{MESSAGES}{failed.pk}/change/")
        failed_buttons = buttons(page)
        injected += page.evaluate(INJECTED_NODES)
        page.click(".outbox-row-actions button[name=reset]")
        page.locator(".messagelist .success").wait_for()
        reset_note = page.locator(".messagelist").inner_text()
        page.goto(f"{MESSAGES}{publish_me.pk}/change/")
        page.click(".outbox-row-actions button[name=publish]")
        page.locator(".messagelist .success").wait_for()
        publish_note = page.locator(".messagelist").inner_text()
        page.goto(f"{MESSAGES}{parked.pk}/change/")
        page.click(".outbox-row-actions button[name=cancel]")
        page.wait_for_url(f"**{MESSAGES}")  # the row is gone: back to the list
        cancel_note = page.locator(".messagelist").inner_text()

    assert parked_buttons == ["Publish now", "Cancel"]
    assert failed_buttons == ["Reset"]
    assert "Parked retry 3" in schedule
    assert f"Reason: {EXCEPTION}: {XSS}" in schedule
    assert "First failed: 2026-11-27T10:00:00+00:00" in schedule
    assert injected == 0
    assert "1 failed outbox message was reset" in reset_note
    assert "1 outbox message is being published." in publish_note
    assert "1 outbox message was cancelled: it will not be published." in cancel_note
    assert confirmations == ["Cancel this message? It is deleted, never published, and revoked."]
    assert not OutboxMessage.objects.filter(pk=parked.pk).exists()
    entry = LogEntry.objects.get(object_id=str(parked.pk))
    assert (entry.user.username, entry.action_flag) == ("root", DELETION)
    failed.refresh_from_db()
    assert (failed.status, failed.attempts) == (MessageStatus.PENDING.value, 0)


def test_outbox_buttons_follow_permissions_and_forged_posts_are_refused(
    admin_server: str,
) -> None:
    make_user("operator", "view_outboxmessage", "change_outboxmessage")
    make_user("canceller", "view_outboxmessage", "cancel_outboxmessage")
    row = pending_row()
    url = f"{MESSAGES}{row.pk}/act/"

    with browser_page(admin_server) as page:
        log_in(page, "operator", f"{MESSAGES}{row.pk}/change/")
        operator = buttons(page)
        token = {"csrfmiddlewaretoken": csrf_token(page)}
        forged = [page.request.post(url + "cancel/", form=token).status]
        page.context.clear_cookies()
        log_in(page, "canceller", f"{MESSAGES}{row.pk}/change/")
        canceller = buttons(page)
        token = {"csrfmiddlewaretoken": csrf_token(page)}
        forged += [page.request.post(url + name + "/", form=token).status for name in
                   ("publish", "reset")]  # fmt: skip
        no_token = page.request.post(url + "cancel/").status

    assert (operator, canceller) == (["Publish now"], ["Cancel"])
    assert forged == [403, 403, 403]
    assert no_token == 403
    assert OutboxMessage.objects.filter(pk=row.pk, status="pending").exists()
    assert not LogEntry.objects.exists()
    assert DeadLetter.objects.count() == 0
