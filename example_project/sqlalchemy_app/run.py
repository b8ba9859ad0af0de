"""Run the SQLAlchemy example: ``python -m example_project.sqlalchemy_app.run``.

It starts a worker (with beat), places three orders (each order and its receipt task
in one session transaction), rolls a fourth back, and waits for the receipts: three,
never four. Then it stops the worker.
"""

from __future__ import annotations

import subprocess
import sys
import time

from sqlalchemy import func, select

from example_project.sqlalchemy_app.app import (
    VAR,
    Order,
    Receipt,
    SessionLocal,
    send_receipt,
    store,
)


def place_order(customer: str, *, commit: bool = True) -> int:
    """Write the order and dispatch its receipt in one transaction."""
    with SessionLocal() as session, store.bind_session(session):
        order = Order(customer=customer)
        session.add(order)
        session.flush()
        send_receipt.delay(order.id)  # an outbox row in this transaction
        if commit:
            session.commit()  # ... published right after this COMMIT
        else:
            session.rollback()  # ... gone with the order: nothing is sent
        return order.id


def receipts() -> int:
    with SessionLocal() as session:
        return session.scalar(select(func.count()).select_from(Receipt)) or 0


def main() -> None:
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "example_project.sqlalchemy_app.app",
            "worker",
            "-B",
            "--pool=solo",
            "-l",
            "warning",
            f"--schedule={VAR / 'beat' / 'schedule'}",
        ]
    )
    try:
        before = receipts()
        for customer in ("ada", "grace", "linus"):
            print(f"order {place_order(customer)} for {customer}: committed")
        place_order("mallory", commit=False)
        print("order for mallory: rolled back")
        deadline = time.monotonic() + 30
        while receipts() - before < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1)
        print(
            f"receipts sent: {receipts() - before} (expected 3); outbox: "
            f"{ {s.value: n for s, n in store.count_by_status().items()} }"
        )
    finally:
        worker.terminate()
        worker.wait(timeout=30)


if __name__ == "__main__":
    main()
