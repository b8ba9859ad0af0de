"""The outbox admin under a strict Content-Security-Policy, and without JavaScript: Playwright
driving Debian's chromium, headless, against a live server on real PostgreSQL (the fixtures
of ``test_admin_browser.py``; skipped like it without Playwright or chromium).

Every response carries ``script-src 'self'; style-src 'self'`` (``tests/django/csp.py``),
as many production sites send it. The confirmation before a dangerous button (discard,
cancel) is a static script reading the button's ``data-confirm``: dismissing it posts
nothing, accepting it posts. Every page of the console renders with its styles and the
browser reports no refused script or style. With JavaScript off the overview's charts
are there and a button still posts (without the question).

As there, rows are prepared before the browser opens and checked after it closes (Django
refuses ORM calls while Playwright's event loop runs).
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

import pytest

from celery_outbox.clock import utcnow
from celery_outbox.store.records import DeadLetterStatus
from django_outbox.models import CompletedTask, DeadLetter, OutboxMessage, Workflow
from tests.django import csp
from tests.django.admin import test_browser as browser
from tests.django.admin.test_browser import XSS, browser_page, log_in, make_user
from tests.django.admin_app import APP_PATH, make_letter, pending_row

#: The browser tests' fixtures: skip without a browser; the live server with the admin's CSS.
_browser_available = browser._browser_available
admin_server = browser.admin_server

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ADMIN = "/admin/django_outbox/"
LETTERS = ADMIN + "deadletter/"
MESSAGES = ADMIN + "outboxmessage/"
DISCARD_QUESTION = "Discard this dead letter? It will not be requeued."
CANCEL_QUESTION = "Cancel this message? It is deleted, never published, and revoked."
#: Reports each refusal the page's policy makes on the console, with what was refused
#: and where (Chromium logs them too, less precisely). Init scripts are not under the policy.
REPORT_VIOLATIONS = """document.addEventListener('securitypolicyviolation', e =>
    console.error('CSP violation: ' + e.violatedDirective + ' blocked ' + e.blockedURI
                  + ' at ' + e.sourceFile + ':' + e.lineNumber));"""


@pytest.fixture(autouse=True)
def _outbox_app(settings: Any) -> None:
    settings.DJANGO_OUTBOX_CELERY_APP = APP_PATH


@pytest.fixture
def strict_csp(settings: Any) -> None:
    """Every response of the live server carries :data:`tests.django.csp.POLICY`."""
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, csp.MIDDLEWARE]


@pytest.fixture
def csp_server(strict_csp: None, admin_server: str) -> str:
    """The live server (started after the policy's middleware was set)."""
    return admin_server


def watch(page: Any) -> tuple[list[str], list[str]]:
    """The console's policy violations and script errors; the POSTs the page sends."""
    problems: list[str] = []
    posts: list[str] = []
    page.add_init_script(REPORT_VIOLATIONS)
    page.on(
        "console",
        lambda m: (
            problems.append(m.text)
            if "Content Security Policy" in m.text or "CSP violation" in m.text
            else None
        ),
    )
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)
    return problems, posts


def answer_dialogs(page: Any, answers: list[bool]) -> list[str]:
    """Answer each confirmation with the next of ``answers`` (accept when ``True``)."""
    seen: list[str] = []

    def on_dialog(dialog: Any) -> None:
        seen.append(dialog.message)
        if answers.pop(0):
            dialog.accept()
        else:
            dialog.dismiss()

    page.on("dialog", on_dialog)
    return seen


def press(page: Any, button: str) -> None:
    """Click a row-page button whose confirmation is dismissed: nothing may follow."""
    page.click(f".outbox-row-actions button[name={button}]")
    page.wait_for_timeout(500)  # long enough for a submission to start


def test_a_confirmation_asks_under_a_strict_csp_and_only_yes_posts(csp_server: str) -> None:
    make_user("root", superuser=True)
    kept, discarded = make_letter(), make_letter()
    row_kept, row_cancelled = pending_row(), pending_row()

    with browser_page(csp_server) as page:
        problems, posts = watch(page)
        questions = answer_dialogs(page, [False, True, False, True])
        log_in(page, "root", f"{LETTERS}{kept.pk}/change/")
        press(page, "discard")
        after_no = page.locator(".messagelist").count()
        page.goto(f"{LETTERS}{discarded.pk}/change/")
        page.click(".outbox-row-actions button[name=discard]")
        page.locator(".messagelist .success").wait_for()
        discard_note = page.locator(".messagelist").inner_text()
        page.goto(f"{MESSAGES}{row_kept.pk}/change/")
        press(page, "cancel")
        after_no += page.locator(".messagelist").count()
        page.goto(f"{MESSAGES}{row_cancelled.pk}/change/")
        page.click(".outbox-row-actions button[name=cancel]")
        page.wait_for_url(f"**{MESSAGES}")
        cancel_note = page.locator(".messagelist").inner_text()

    assert questions == [DISCARD_QUESTION, DISCARD_QUESTION, CANCEL_QUESTION, CANCEL_QUESTION]
    assert problems == []
    assert after_no == 0
    acts = [url.split(ADMIN, 1)[1] for url in posts if "/act/" in url]
    assert acts == [
        f"deadletter/{discarded.pk}/act/discard/",
        f"outboxmessage/{row_cancelled.pk}/act/cancel/",
    ]
    assert "1 dead letter was discarded." in discard_note
    assert "1 outbox message was cancelled" in cancel_note
    kept.refresh_from_db()
    discarded.refresh_from_db()
    assert (kept.status, discarded.status) == ("dead", DeadLetterStatus.DISCARDED.value)
    assert set(OutboxMessage.objects.values_list("pk", flat=True)) == {row_kept.pk}


def console() -> dict[str, str]:
    """One row of every kind, with ``<script>`` in its texts; every console page's path."""
    now = utcnow()
    letter = make_letter(exception_message=XSS, args=[XSS], failed_at=now)
    row = pending_row(available_at=now + timedelta(hours=1), last_error=XSS)
    workflow = Workflow.objects.create(
        root_id=str(uuid.uuid4()), name=XSS, status="running", steps_total=2, steps_done=1,
        created_at=now,
    )  # fmt: skip
    done = CompletedTask.objects.create(
        task_id=str(uuid.uuid4()), task_name=XSS, completed_at=now, root_id=workflow.root_id
    )
    group = urlencode(
        {"task": letter.task_name, "exception": letter.exception_type, "upto": letter.pk}
    )
    return {
        "overview": ADMIN + "overview/",
        "group confirmation": ADMIN + "overview/group/discard/?" + group,
        "dead-letter list": LETTERS,
        "dead-letter page": f"{LETTERS}{letter.pk}/change/",
        "outbox message list": MESSAGES,
        "outbox message page": f"{MESSAGES}{row.pk}/change/",
        "workflow list": ADMIN + "workflow/",
        "workflow page": f"{ADMIN}workflow/{workflow.pk}/change/",
        "completed task list": ADMIN + "completedtask/",
        "completed task page": f"{ADMIN}completedtask/{done.pk}/change/",
    }


#: Whether the page's outbox styles apply (a class of ``django_outbox/outbox.css``).
STYLED = """() => { const probe = document.createElement('span');
    probe.className = 'outbox-nowrap'; document.body.appendChild(probe);
    const applied = getComputedStyle(probe).whiteSpace === 'nowrap'; probe.remove();
    return applied; }"""


def test_every_console_page_renders_under_a_strict_csp(csp_server: str) -> None:
    make_user("root", superuser=True)
    pages = console()

    with browser_page(csp_server) as page:
        problems, _ = watch(page)
        log_in(page, "root", pages["overview"])
        served, styled = {}, {}
        for name, path in pages.items():
            response = page.goto(path)
            served[name] = (response.status, response.headers["content-security-policy"])
            styled[name] = page.evaluate(STYLED)
        charts = page.goto(pages["overview"]) and page.locator("svg.outbox-chart").count()

    assert served == dict.fromkeys(pages, (200, csp.POLICY))
    assert problems == []
    assert styled == {name: name != "group confirmation" for name in pages}  # admin's own
    assert charts == 1  # dead letters (publishes are not kept by the test app)


def test_without_javascript_the_charts_show_and_a_button_still_posts(admin_server: str) -> None:
    make_user("root", superuser=True)
    make_letter(failed_at=utcnow())
    row = pending_row()

    with browser_page(admin_server, javascript=False) as page:
        log_in(page, "root", ADMIN + "overview/")
        charts = page.locator("svg.outbox-chart").count()
        bars = page.locator("svg.outbox-chart rect").count()
        page.goto(f"{MESSAGES}{row.pk}/change/")
        page.click(".outbox-row-actions button[name=cancel]")
        page.wait_for_url(f"**{MESSAGES}")
        cancel_note = page.locator(".messagelist").inner_text()

    assert (charts, bars) == (1, 24)
    assert "1 outbox message was cancelled" in cancel_note
    assert not OutboxMessage.objects.filter(pk=row.pk).exists()
    assert DeadLetter.objects.count() == 1
