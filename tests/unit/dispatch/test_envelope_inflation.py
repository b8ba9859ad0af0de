"""Bounded inflation and the accept list of ``decode_body`` (issue 13 #1): pure logic."""

from __future__ import annotations

import base64
import bz2
import datetime as dt
import lzma
import tracemalloc
import zlib
from collections.abc import Callable
from datetime import timedelta

import pytest
from celery import Celery

from celery_outbox import OutboxTask, PayloadError
from celery_outbox.dispatch import envelope as inflation
from celery_outbox.dispatch.envelope import build_message, decode_body, inflate

BOMB = 32 * 1024 * 1024
LIMIT = 1024 * 1024


def noop(*args: object) -> None:
    """A task body that does nothing."""


@pytest.mark.parametrize(
    ("compress", "content_type"),
    [
        (zlib.compress, "application/x-gzip"),
        (bz2.compress, "application/x-bz2"),
        (lzma.compress, "application/x-lzma"),
    ],
    ids=["zlib", "bzip2", "lzma"],
)
def test_a_bomb_is_refused_after_inflating_the_limit_and_no_more(
    compress: Callable[[bytes], bytes], content_type: str
) -> None:
    data = compress(b" " * BOMB)
    tracemalloc.start()
    try:
        with pytest.raises(PayloadError, match=f"outbox_max_payload_bytes={LIMIT}"):
            inflate(data, content_type, max_bytes=LIMIT)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 12 * LIMIT  # the output limit, plus lzma's 8 MiB dictionary
    assert inflate(compress(b"x" * LIMIT), content_type, max_bytes=LIMIT) == b"x" * LIMIT


def test_an_xz_stream_needing_more_decoder_memory_than_the_limit_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Preset 6 needs about 9 MiB to decode; a hostile header can ask for 1.5 GiB.
    monkeypatch.setattr(inflation, "LZMA_MEMLIMIT", 1024 * 1024)
    with pytest.raises(lzma.LZMAError, match="Memory usage limit"):
        inflate(lzma.compress(b"x"), "application/x-lzma", max_bytes=LIMIT)


def test_unknown_codecs_are_refused_when_decoding() -> None:
    with pytest.raises(PayloadError, match="compression 'application/x-brotli' is refused"):
        inflate(b"anything", "application/x-brotli", max_bytes=LIMIT)


def test_a_content_type_outside_accept_is_refused_before_decoding() -> None:
    options = {"content_type": "application/x-yaml", "content_encoding": "utf-8"}
    with pytest.raises(PayloadError, match="'application/x-yaml' is not accepted"):
        decode_body(
            "!!python/object/apply:os.system ['true']", options, accept=["json"], max_bytes=None
        )


def test_a_compressed_json_body_within_the_limit_decodes() -> None:
    raw = base64.b64encode(zlib.compress(b'[[1], {"a": 2}, {}]')).decode()
    options = {
        "content_type": "application/json",
        "content_encoding": "utf-8",
        "compression": "application/x-gzip",
        "body_encoding": "base64",
    }
    assert decode_body(raw, options, accept=["json"], max_bytes=100) == [[1], {"a": 2}, {}]


@pytest.mark.parametrize("compression", ["brotli", "bogus"])
def test_dispatch_refuses_a_compression_the_relay_cannot_inflate(compression: str) -> None:
    app = Celery("inflation", broker="memory://", set_as_current=False)
    task = app.task(base=OutboxTask, name="inflation.t")(noop)
    with pytest.raises(PayloadError, match=f"'inflation.t' with compression='{compression}'"):
        build_message(
            task,
            (1,),
            {},
            task_id="tid",
            options={"compression": compression},
            now=dt.datetime.now(dt.timezone.utc),
            park_after=timedelta(seconds=30),
            max_bytes=None,
        )
