"""Kombu's filesystem transport, with messages written atomically.

Kombu's filesystem transport creates a message file, then writes it: a consumer polling
the folder in between may take the empty file and lose the message. This subclass
writes to a hidden temporary name and renames it into place (``os.replace`` is atomic on
one filesystem), so a consumer sees a message file only once it is complete. Everything
else is Kombu's transport (``CELERY_BROKER_URL = "filesystem://"``).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from time import monotonic
from typing import Any

from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    """Writes each message to a temporary file, then renames it into the queue folder."""

    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        # Consumers only take names ending in ".<queue>.msg": this one is skipped.
        partial = os.path.join(self.data_folder_out, f".{name}.partial")
        with open(partial, "wb") as file:
            file.write(str_to_bytes(dumps(payload)))
        os.replace(partial, final)


class Transport(filesystem.Transport):
    """``filesystem://`` with :class:`Channel`."""

    Channel = Channel


def transport_options(folder: Path, *, polling_interval: float = 0.1) -> dict[str, Any]:
    """Transport options keeping every broker file under ``folder`` (created here)."""
    paths = {name: folder / name for name in ("queue", "processed", "control")}
    for path in paths.values():
        path.mkdir(parents=True, exist_ok=True)
    return {
        "data_folder_in": str(paths["queue"]),
        "data_folder_out": str(paths["queue"]),
        # Keeping processed messages on the same filesystem makes taking one a rename.
        "store_processed": True,
        "processed_folder": str(paths["processed"]),
        "control_folder": str(paths["control"]),
        "polling_interval": polling_interval,
    }
