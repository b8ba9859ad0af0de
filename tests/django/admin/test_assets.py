"""The outbox admin's pages hold no inline script, event handler or style (a strict
Content-Security-Policy would refuse them: the browser's view is
``test_admin_csp_browser.py``), and a button's confirmation text is escaped in its
attribute. Through Django's test client on real PostgreSQL.
"""

from __future__ import annotations

import re
import uuid
from typing import Any
from urllib.parse import urlencode

import pytest
from django.template.loader import render_to_string
from django.test import Client

from celery_outbox.clock import utcnow
from celery_outbox.store.records import MessageStatus
from django_outbox.models import CompletedTask, OutboxMessage, Workflow
from tests.django.admin_app import APP_PATH, make_letter

pytestmark = pytest.mark.django_db

ADMIN = "/admin/django_outbox/"
#: What a policy of ``script-src 'self'; style-src 'self'`` refuses: a ``<script>`` with
#: code in it (not a JSON data block), an ``on...=`` handler, a ``javascript:`` URL,
#: a ``<style>`` element or a ``style=`` attribute.
INLINE = re.compile(
    r"<script(?![^>]*\bsrc=)(?![^>]*type=\"application/json\")[^>]*>"
    r"|\son[a-z]+\s*=|javascript:|<style|\sstyle\s*=",
    re.IGNORECASE,
)


@pytest.fixture(autouse=True)
def _outbox_app(settings: Any) -> None:
    settings.DJANGO_OUTBOX_CELERY_APP = APP_PATH
    settings.STATIC_URL = "/static/"


def console_paths() -> list[str]:
    """Every page of the console, over one row of each kind (buttons shown)."""
    letter = make_letter(failed_at=utcnow())
    row = OutboxMessage.objects.create(
        task_id=str(uuid.uuid4()), task_name="shop.ship", payload="[[], {}, {}]", options={},
        status=MessageStatus.PENDING.value, available_at=utcnow(),
    )  # fmt: skip
    workflow = Workflow.objects.create(
        root_id=str(uuid.uuid4()), name="shop.checkout", status="running", steps_total=2,
        steps_done=1, created_at=utcnow(),
    )  # fmt: skip
    done = CompletedTask.objects.create(
        task_id=str(uuid.uuid4()), task_name="shop.ship", completed_at=utcnow()
    )
    group = {"task": letter.task_name, "exception": letter.exception_type, "upto": letter.pk}
    return [
        ADMIN + "overview/",
        ADMIN + "overview/group/discard/?" + urlencode(group),
        ADMIN + "deadletter/",
        f"{ADMIN}deadletter/{letter.pk}/change/",
        ADMIN + "outboxmessage/",
        f"{ADMIN}outboxmessage/{row.pk}/change/",
        ADMIN + "workflow/",
        f"{ADMIN}workflow/{workflow.pk}/change/",
        ADMIN + "completedtask/",
        f"{ADMIN}completedtask/{done.pk}/change/",
    ]


def test_no_page_holds_an_inline_script_handler_or_style(admin_client: Client) -> None:
    found = {}
    for path in console_paths():
        response = admin_client.get(path)
        assert response.status_code == 200, path
        found[path] = INLINE.findall(response.content.decode())
    assert found == {path: [] for path in found}


def test_the_pages_load_the_static_style_sheet_and_the_confirmation(
    admin_client: Client,
) -> None:
    paths = console_paths()
    pages = {path: admin_client.get(path).content.decode() for path in paths}
    sheet = 'href="/static/django_outbox/outbox.css"'
    script = 'src="/static/django_outbox/confirm.js"'
    assert [path for path, html in pages.items() if sheet not in html] == [paths[1]]
    assert script in pages[paths[3]]  # the rows' buttons
    assert script in pages[paths[5]]
    assert 'data-confirm="Discard this dead letter? It will not be requeued."' in pages[paths[3]]


def test_a_confirmation_text_is_escaped_in_its_attribute() -> None:
    hostile = "\"><script>alert('x')</script>"
    button = {"name": "cancel", "label": "Cancel", "url": "/x/", "confirm": hostile}
    html = render_to_string(
        "admin/django_outbox/row_action_buttons.html", {"outbox_row_actions": [button]}
    )
    assert 'data-confirm="&quot;&gt;&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;"' in html
    assert "<script>" not in html
