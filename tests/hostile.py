"""Rows an attacker (or a careless operator) writes straight into the outbox table.

Each helper returns ``(payload, options)`` for a row of an otherwise valid message:
the relay must refuse them without decoding (pickle) or without inflating them
(compression bombs).
"""

from __future__ import annotations

import base64
import pickle
import zlib
from pathlib import Path
from typing import Any

#: Inflated size of :func:`zlib_bomb` (compressed: about 250 KiB).
BOMB_BYTES = 256 * 1024 * 1024


class _CreatesFile:
    """Unpickling it calls ``open(path, "w")``: the file appears."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.path), "w"))


def pickle_row(options: dict[str, Any], marker: Path) -> tuple[str, dict[str, Any]]:
    """A pickle body whose unpickling creates ``marker``."""
    body = pickle.dumps(((_CreatesFile(marker),), {}, {}), protocol=2)
    return base64.b64encode(body).decode("ascii"), {
        **options,
        "content_type": "application/x-python-serialize",
        "content_encoding": "binary",
        "body_encoding": "base64",
    }


def zlib_bomb(options: dict[str, Any], size: int = BOMB_BYTES) -> tuple[str, dict[str, Any]]:
    """A JSON row compressed with zlib that inflates to ``size`` bytes of spaces."""
    deflate = zlib.compressobj(9)
    chunk = b" " * (1024 * 1024)
    parts = [deflate.compress(b"[[], {}, {}]")]
    parts += [deflate.compress(chunk) for _ in range(size // len(chunk))]
    parts.append(deflate.flush())
    return base64.b64encode(b"".join(parts)).decode("ascii"), {
        **options,
        "content_type": "application/json",
        "content_encoding": "utf-8",
        "compression": "application/x-gzip",
        "body_encoding": "base64",
    }
