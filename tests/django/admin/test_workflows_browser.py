"""The workflow admin in a real browser at 1280 x 800: Playwright driving Debian's chromium,
headless, against a live server on real PostgreSQL (the fixtures of
``test_admin_browser.py``; skipped like it without Playwright or chromium).

A superuser reads the list without scrolling sideways (no cell wrapped into more than
three lines), filters it, opens a workflow,
follows its dead letter's link and comes back through the letter's workflow link; a name
holding ``<script>`` renders as text.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from celery_outbox.store.records import MessageStatus
from django_outbox.models import CompletedTask, OutboxMessage, Workflow
from tests.django.admin import test_browser as browser
from tests.django.admin.test_browser import INJECTED_NODES, PASSWORD, XSS, browser_page, make_user
from tests.django.admin.test_pages_browser import widest_cells
from tests.django.admin_app import make_letter

#: The browser tests' fixtures: skip without a browser; the live server with the admin's CSS.
_browser_available = browser._browser_available
admin_server = browser.admin_server

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

WORKFLOWS_PATH = "/admin/django_outbox/workflow/"
WIDTH, HEIGHT = 1280, 800
#: The screenshots docs/operations.md shows.
IMAGES = Path(__file__).resolve().parents[3] / "docs" / "images"
SCREENSHOT = IMAGES / "admin-workflows.png"
PAGE_SCREENSHOT = IMAGES / "admin-workflow.png"
WHEN = datetime(2026, 3, 4, 5, 6, 7, tzinfo=timezone.utc)
#: A long but realistic canvas name (``Workflow.name`` is the first task's name).
NAME = "shop.checkout.tasks.place_order_and_notify_customer"


def workflows() -> tuple[Workflow, str]:
    """Twenty workflows in every status; the failed one with a done step, a dead letter
    and a pending step; that workflow and its dead letter's task id.
    """
    rows = [
        Workflow.objects.create(
            root_id=str(uuid.uuid4()),
            name=f"{NAME}_{n % 3}",
            status=("running", "succeeded", "failed")[n % 3],
            steps_total=120,
            steps_done=n,
            created_at=WHEN + timedelta(minutes=n),
            finished_at=None if n % 3 == 0 else WHEN + timedelta(minutes=n, seconds=30),
            failed_task_id=str(uuid.uuid4()) if n % 3 == 2 else None,
        )
        for n in range(20)
    ]
    failed = rows[2]
    CompletedTask.objects.create(
        task_id=str(uuid.uuid4()), task_name=NAME, completed_at=WHEN, root_id=failed.root_id
    )
    letter = make_letter(options={"canvas": {"root_id": failed.root_id}})
    OutboxMessage.objects.create(
        task_id=str(uuid.uuid4()),
        task_name=NAME,
        payload="[[], {}, {}]",
        options={"headers": {"root_id": failed.root_id}},
        status=MessageStatus.PENDING.value,
        available_at=WHEN,
    )
    return failed, str(letter.task_id)


def log_in(page: Any) -> None:
    page.set_viewport_size({"width": WIDTH, "height": HEIGHT})
    page.goto("/admin/login/?next=" + WORKFLOWS_PATH)
    page.fill("#id_username", "root")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url("**" + WORKFLOWS_PATH)


def overflow(page: Any) -> int:
    """How many pixels the page is wider than the window (0: no sideways scrolling)."""
    width: int = page.evaluate("() => document.documentElement.scrollWidth")
    return max(0, width - WIDTH)


def test_the_list_fits_1280_pixels_and_leads_to_a_workflows_steps(admin_server: str) -> None:
    make_user("root", superuser=True)
    failed, letter_task_id = workflows()

    with browser_page(admin_server) as page:
        log_in(page)
        page.screenshot(path=str(SCREENSHOT))
        assert page.locator("#result_list tbody tr").count() == 20
        assert overflow(page) == 0
        widest = widest_cells(page)
        assert len(widest) == 6, widest  # no actions: six columns
        assert max(widest.values()) <= 3, widest
        headers = page.locator("#result_list thead th")
        last = headers.nth(headers.count() - 1).bounding_box()
        assert last is not None
        assert last["x"] + last["width"] <= WIDTH
        page.locator("#changelist-filter").get_by_role("link", name="failed").click()
        page.wait_for_url("**status__exact=failed*")
        assert page.locator("#result_list tbody tr").count() == 6
        page.get_by_role("link", name=failed.root_id, exact=True).click()
        page.wait_for_url(f"**/workflow/{failed.pk}/change/**")
        assert overflow(page) == 0
        assert page.locator("table.outbox-steps").count() == 3
        page.screenshot(path=str(PAGE_SCREENSHOT), full_page=True)
        page.get_by_role("link", name=letter_task_id, exact=True).click()
        page.wait_for_url("**/deadletter/*/change/**")
        page.get_by_role("link", name=failed.root_id, exact=True).click()
        page.wait_for_url(f"**/workflow/{failed.pk}/change/**")


def test_a_script_in_a_workflow_renders_as_text(admin_server: str) -> None:
    make_user("root", superuser=True)
    row = Workflow.objects.create(
        root_id=XSS[:255],
        name=XSS[:255],
        status="running",
        steps_total=1,
        steps_done=0,
        created_at=WHEN,
    )
    make_letter(task_id=XSS[:255], options={"canvas": {"root_id": row.root_id}})
    dialogs: list[str] = []

    with browser_page(admin_server) as page:
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        log_in(page)
        list_nodes = page.evaluate(INJECTED_NODES)
        page.goto(f"{WORKFLOWS_PATH}{row.pk}/change/")
        page_nodes = page.evaluate(INJECTED_NODES)
        shown = page.locator(".field-name .readonly").inner_text()

    assert (list_nodes, page_nodes, dialogs) == (0, 0, [])
    assert shown == XSS[:255]
