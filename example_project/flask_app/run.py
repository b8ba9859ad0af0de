"""Run the Flask example: ``python -m example_project.flask_app.run``.

It starts a worker (with beat), places three orders through the app's test client (each
order and its receipt task in one transaction), rolls a fourth back, and waits for the
receipts: three, never four. Then it stops the worker.
"""

from __future__ import annotations

import subprocess
import sys
import time

from example_project.flask_app.app import VAR, flask_app


def main() -> None:
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "example_project.flask_app.app",
            "worker",
            "-B",
            "--pool=solo",
            "-l",
            "warning",
            f"--schedule={VAR / 'beat' / 'schedule'}",
        ]
    )
    try:
        client = flask_app.test_client()
        before = len(client.get("/receipts").get_json()["order_ids"])
        for customer in ("ada", "grace", "linus"):
            placed = client.post("/orders", json={"customer": customer}).get_json()
            print(f"order {placed['id']} for {customer}: committed")
        refused = client.post("/orders?fail=1", json={"customer": "mallory"})
        print(f"order for mallory: rolled back (HTTP {refused.status_code})")
        deadline = time.monotonic() + 60
        sent = before
        while sent - before < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
            sent = len(client.get("/receipts").get_json()["order_ids"])
        time.sleep(1)
        sent = len(client.get("/receipts").get_json()["order_ids"])
        print(f"receipts sent: {sent - before} (expected 3)")
    finally:
        worker.terminate()
        worker.wait(timeout=30)


if __name__ == "__main__":
    main()
