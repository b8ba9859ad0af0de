"""Run the FastAPI example: ``python -m example_project.fastapi_app.run``.

It starts a worker (with beat), places three orders through the API (each order and its
receipt task in one ``AsyncSession`` transaction), rolls a fourth back, and waits for the
receipts: three, never four. Then it stops the worker.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

import httpx

from example_project.fastapi_app.app import VAR, api


async def story() -> None:
    transport = httpx.ASGITransport(app=api)
    async with httpx.AsyncClient(transport=transport, base_url="http://shop") as client:
        before = len((await client.get("/receipts")).json()["order_ids"])
        for customer in ("ada", "grace", "linus"):
            placed = (await client.post("/orders", json={"customer": customer})).json()
            print(f"order {placed['id']} for {customer}: committed")
        refused = await client.post("/orders?fail=true", json={"customer": "mallory"})
        print(f"order for mallory: rolled back (HTTP {refused.status_code})")
        sent = before
        for _ in range(300):
            sent = len((await client.get("/receipts")).json()["order_ids"])
            if sent - before >= 3:
                break
            await asyncio.sleep(0.2)
        await asyncio.sleep(1)
        sent = len((await client.get("/receipts")).json()["order_ids"])
        print(f"receipts sent: {sent - before} (expected 3)")


def main() -> None:
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "example_project.fastapi_app.app",
            "worker",
            "-B",
            "--pool=solo",
            "-l",
            "warning",
            f"--schedule={VAR / 'beat' / 'schedule'}",
        ]
    )
    try:
        asyncio.run(story())
    finally:
        worker.terminate()
        worker.wait(timeout=30)


if __name__ == "__main__":
    main()
