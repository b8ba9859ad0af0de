"""Inflate a stored compressed body in bounded steps, never beyond a byte limit.

Anyone who can write the outbox table chooses a row's compression. A compressed body is
inflated in steps that stop once it outgrows ``outbox_max_payload_bytes``, so a
compression bomb allocates no more than that, and only codecs that can be inflated this
way are accepted, at dispatch (:func:`check_compression`) and when a row is decoded
(:func:`inflate`, used by :func:`celery_outbox.envelope.decode_body`).
"""

from __future__ import annotations

import bz2
import importlib.util
import io
import lzma
import sys
import zlib
from collections.abc import Callable, Mapping

from celery_outbox.exceptions import PayloadError

#: Inflates ``data`` to at most ``limit`` bytes (returning ``limit + 1`` when there is more).
Inflater = Callable[[bytes, int], bytes]


def _zlib(data: bytes, limit: int) -> bytes:
    # kombu's "zlib" and "gzip" both store zlib streams as application/x-gzip;
    # wbits=47 also reads a real gzip header.
    return zlib.decompressobj(wbits=47).decompress(data, limit + 1)


def _bz2(data: bytes, limit: int) -> bytes:
    return bz2.BZ2Decompressor().decompress(data, max_length=limit + 1)


#: Memory an xz/lzma decoder may use: its dictionary comes from the stream's header (up to
#: 1.5 GiB); kombu's ``lzma.compress`` (preset 6) needs about 9 MiB, preset 9 about 65 MiB.
LZMA_MEMLIMIT = 128 * 1024 * 1024


def _lzma(data: bytes, limit: int) -> bytes:
    decoder = lzma.LZMADecompressor(memlimit=LZMA_MEMLIMIT)
    return decoder.decompress(data, max_length=limit + 1)


def _zstd(data: bytes, limit: int) -> bytes:  # pragma: no cover - needs zstandard
    import zstandard  # type: ignore[import-not-found]  # optional, as in kombu

    reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data))
    return bytes(reader.read(limit + 1))


def _inflaters() -> dict[str, Inflater]:
    found: dict[str, Inflater] = {
        "application/x-gzip": _zlib,
        "application/x-bz2": _bz2,
        "application/x-lzma": _lzma,
    }
    if importlib.util.find_spec("zstandard") is not None:  # pragma: no cover - optional
        found["application/zstd"] = _zstd
    return found


#: Compression content types the relay can inflate in bounded steps.
INFLATERS: Mapping[str, Inflater] = _inflaters()

#: kombu's compression names (``compression=`` at dispatch) and their content types.
CODECS: Mapping[str, str] = {
    "zlib": "application/x-gzip",
    "gzip": "application/x-gzip",
    "bzip2": "application/x-bz2",
    "bzip": "application/x-bz2",
    "lzma": "application/x-lzma",
    "xz": "application/x-lzma",
    **({"zstd": "application/zstd"} if "application/zstd" in INFLATERS else {}),
}


def check_compression(task_name: str, compression: str) -> None:
    """Refuse at dispatch a compression the relay could not inflate safely.

    Raises
    ------
    PayloadError
        Naming the task, the compression and the accepted ones.
    """
    if compression not in CODECS and compression not in INFLATERS:
        raise PayloadError(
            f"Cannot dispatch task {task_name!r} with compression={compression!r}: "
            f"the outbox accepts {sorted(CODECS)} (brotli and unknown codecs cannot be "
            "inflated in bounded steps)."
        )


def inflate(data: bytes, compression: str, *, max_bytes: int | None) -> bytes:
    """Inflate ``data`` compressed with ``compression`` (a content type), at most ``max_bytes``.

    Raises
    ------
    PayloadError
        For a codec with no bounded inflater, or a body larger than ``max_bytes`` once
        inflated (found after inflating ``max_bytes + 1`` bytes, no more).
    """
    inflater = INFLATERS.get(compression)
    if inflater is None:
        raise PayloadError(
            f"compression {compression!r} is refused: the relay inflates only "
            f"{sorted(INFLATERS)}; the body was not decoded."
        )
    limit = sys.maxsize - 1 if max_bytes is None else max_bytes
    raw = inflater(data, limit)
    if len(raw) > limit:
        raise PayloadError(
            f"compressed body inflates beyond outbox_max_payload_bytes={max_bytes}; "
            "it was not decoded (a compression bomb, or a row the limit no longer allows)."
        )
    return raw
