"""The example project passes Django's checks, migrates, and its migrations are current."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("django", reason="the example project needs Django")

ROOT = Path(__file__).resolve().parents[2]
MANAGE = ROOT / "example_project" / "manage.py"


def manage(*args: str, var_dir: Path) -> subprocess.CompletedProcess[str]:
    """Run ``example_project/manage.py`` on its embedded defaults in ``var_dir``."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("CELERY_", "SHOP_", "DJANGO_")) and key != "DATABASE_URL"
    }
    env["SHOP_VAR_DIR"] = str(var_dir)
    return subprocess.run(
        [sys.executable, str(MANAGE), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    "args",
    [
        ("check", "--fail-level", "WARNING"),
        ("makemigrations", "shop", "--check", "--dry-run"),
    ],
)
def test_project_checks(args: tuple[str, ...], tmp_path: Path) -> None:
    done = manage(*args, var_dir=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_migrate_then_place_orders_without_a_worker(tmp_path: Path) -> None:
    for args in (("migrate", "--no-input"), ("place_orders", "3", "--batch", "t")):
        done = manage(*args, var_dir=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
    assert "Placed 3 order(s)." in done.stdout
    # Published on commit to the file broker in var/: each order's push and the first step
    # of its fulfilment workflow wait there.
    assert len(list((tmp_path / "broker" / "queue").glob("*.msg"))) == 6


VIEW_SCRIPT = """
from django.test import Client
from django_outbox.models import OutboxMessage, Workflow
from shop.models import Notification, Order
response = Client().post("/", {"customer": "Ada", "phone": "+33612345678",
                               "device": "d-1", "total": "12.50"})
order = Order.objects.get()
note = Notification.objects.get()
row = OutboxMessage.objects.get(task_name="shop.send_push")
first = OutboxMessage.objects.get(task_name="shop.reserve_stock")
flow = Workflow.objects.get()
print(response.status_code, order.items.count(), note.channel, row.task_name,
      row.task_id == note.task_id, row.status, first.status,
      flow.root_id == first.task_id == order.fulfilment_id, flow.status, flow.steps_total)
"""

ROLLBACK_SCRIPT = """
from decimal import Decimal
from django.db import transaction
from django_outbox.models import OutboxMessage, Workflow
from shop import services
from shop.models import Order
try:
    with transaction.atomic():
        services.place_order(
            customer="Ada", phone="+33612345678", total=Decimal("1"), items=["mug"]
        )
        raise RuntimeError("payment declined")
except RuntimeError:
    pass
print(Order.objects.count(), OutboxMessage.objects.count(), Workflow.objects.count())
"""


def test_the_view_writes_the_order_its_notification_and_its_workflow_together(
    tmp_path: Path,
) -> None:
    assert manage("migrate", "--no-input", var_dir=tmp_path).returncode == 0
    done = manage("shell", "-c", VIEW_SCRIPT, var_dir=tmp_path)
    # Two items: reserve_stock, a chord of two pack_item steps and ship are four steps.
    expected = [
        "200",
        "2",
        "push",
        "shop.send_push",
        "True",
        "published",
        "published",
        "True",
        "running",
        "4",
    ]
    assert done.stdout.split()[-10:] == expected, done.stdout + done.stderr
    assert len(list((tmp_path / "broker" / "queue").glob("*.msg"))) == 2


def test_a_rolled_back_order_leaves_neither_row_nor_message(tmp_path: Path) -> None:
    assert manage("migrate", "--no-input", var_dir=tmp_path).returncode == 0
    done = manage("shell", "-c", ROLLBACK_SCRIPT, var_dir=tmp_path)
    assert done.stdout.split()[-3:] == ["0", "0", "0"], done.stdout + done.stderr
    assert list((tmp_path / "broker" / "queue").glob("*.msg")) == []
