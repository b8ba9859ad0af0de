"""Loaded by every Python process of a demo test (``PYTHONPATH``): no network connections.

Any TCP/UDP ``connect`` is refused and written to ``$OUTBOX_DEMO_CONNECT_LOG``, so a
test can prove that the demo, its worker and its beat touched no server at all.
"""

from __future__ import annotations

import os
import socket
from typing import Any

_LOG = os.environ.get("OUTBOX_DEMO_CONNECT_LOG")
_NETWORK_FAMILIES = (socket.AF_INET, socket.AF_INET6)


def _refuse(sock: socket.socket, address: Any) -> None:
    if _LOG:
        with open(_LOG, "a", encoding="utf-8") as log:
            log.write(f"pid {os.getpid()} tried to connect to {address!r}\n")
    raise ConnectionRefusedError(f"demo test: no network connection allowed ({address!r})")


def _guarded(method: Any) -> Any:
    def connect(self: socket.socket, address: Any) -> Any:
        if self.family in _NETWORK_FAMILIES:
            _refuse(self, address)
        return method(self, address)

    return connect


if _LOG:
    socket.socket.connect = _guarded(socket.socket.connect)  # type: ignore[method-assign]
    socket.socket.connect_ex = _guarded(socket.socket.connect_ex)  # type: ignore[method-assign]
