"""A task message built once at call time, and its body inflated back in bounded steps.

Inflate a stored compressed body in bounded steps, never beyond a byte limit.

Anyone who can write the outbox table chooses a row's compression. A compressed body is
inflated in steps that stop once it outgrows ``outbox_max_payload_bytes``, so a
compression bomb allocates no more than that, and only codecs that can be inflated this
way are accepted, at dispatch (:func:`check_compression`) and when a row is decoded
(:func:`inflate`, used by :func:`celery_outbox.dispatch.envelope.decode_body`).

Build a task message once, at call time, exactly as Celery would publish it.

Celery's own ``Task.apply_async`` runs against a producer that captures the message
instead of sending it (:func:`celery_outbox._compat.capture_message`): routing, headers,
ETA/expiry, priorities, parent and root ids and the ``before_task_publish`` signal all
stay Celery's. The body is serialised here, with the task's serializer, so a bad argument
fails at the call site, inside the caller's transaction, and the stored message is
published later without rebuilding it.
"""

from __future__ import annotations

import base64
import bz2
import importlib.util
import io
import lzma
import sys
import zlib
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo
from typing import Any

from celery import Task
from celery.result import AsyncResult
from kombu.compression import compress
from kombu.exceptions import EncodeError
from kombu.serialization import dumps, loads, prepare_accept_content

from celery_outbox._compat import capture_message
from celery_outbox.dispatch.validation import (
    as_datetime,
    check_argument_depth,
    check_message,
    check_schedule,
    with_storable_reprs,
)
from celery_outbox.exceptions import PayloadError
from celery_outbox.store.records import NewMessage
from celery_outbox.tracing import with_context

# --- Inflate a stored compressed body in bounded steps, never beyond a byte limit.

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


# --- Build a task message once, at call time, exactly as Celery would publish it.

#: ``options["body_encoding"]`` of a payload stored as base64 (binary or compressed bodies).
BODY_ENCODING_BASE64 = "base64"


def serialise_body(
    task_name: str,
    body: Any,
    *,
    serializer: str,
    compression: str | None,
    max_bytes: int | None,
    accept: Collection[str] | None = None,
) -> tuple[str, dict[str, Any]]:
    """Serialise a message body; return the stored payload and its content options.

    Raises
    ------
    PayloadError
        When a value cannot be serialised (naming the task and the type), the
        serialised body is larger than ``max_bytes``, or workers accepting only
        ``accept`` (Celery's ``accept_content``) would refuse its content type.
    """
    try:
        content_type, content_encoding, data = dumps(body, serializer=serializer)
        raw = data.encode(content_encoding) if isinstance(data, str) else data
    except (EncodeError, TypeError, ValueError) as exc:
        raise PayloadError(
            f"Cannot dispatch task {task_name!r}: its arguments cannot be serialised "
            f"with {serializer!r}: {exc}"
        ) from exc
    if accept is not None and content_type not in (prepare_accept_content(accept) or ()):
        raise PayloadError(
            f"Cannot dispatch task {task_name!r} with serializer {serializer!r}: workers "
            f"refuse {content_type!r} (accept_content={list(accept)!r}). Use a serializer "
            "in accept_content, or add this one there if you trust every producer."
        )
    if max_bytes is not None and len(raw) > max_bytes:
        raise PayloadError(
            f"Cannot dispatch task {task_name!r}: its serialised arguments are {len(raw)} bytes, "
            f"above outbox_max_payload_bytes={max_bytes}. Pass a reference (an id) instead."
        )
    content: dict[str, Any] = {"content_type": content_type, "content_encoding": content_encoding}
    if compression:
        check_compression(task_name, compression)
        raw, content["compression"] = compress(raw, compression)
    if compression or content_encoding == "binary":
        content["body_encoding"] = BODY_ENCODING_BASE64
        return base64.b64encode(raw).decode("ascii"), content
    return raw.decode(content_encoding), content


@dataclass(frozen=True)
class Call:
    """One call of a task as Celery built it: the outbox row to write, and the
    ``AsyncResult`` Celery returns for it (``ignored`` set, the result backend told).
    """

    message: NewMessage
    result: AsyncResult[Any]


def build_message(
    task: Task[Any, Any],
    args: Sequence[Any] | None,
    kwargs: Mapping[str, Any] | None,
    *,
    task_id: str,
    options: Mapping[str, Any],
    now: datetime,
    park_after: timedelta,
    max_bytes: int | None,
    lease: timedelta | None = None,
    validate: bool = True,
) -> NewMessage:
    """The outbox row of :func:`build_call` (same arguments, same errors)."""
    return build_call(
        task,
        args,
        kwargs,
        task_id=task_id,
        options=options,
        now=now,
        park_after=park_after,
        max_bytes=max_bytes,
        lease=lease,
        validate=validate,
    ).message


def build_call(
    task: Task[Any, Any],
    args: Sequence[Any] | None,
    kwargs: Mapping[str, Any] | None,
    *,
    task_id: str,
    options: Mapping[str, Any],
    now: datetime,
    park_after: timedelta,
    max_bytes: int | None,
    lease: timedelta | None = None,
    validate: bool = True,
) -> Call:
    """Build the outbox row for one call of ``task``, and Celery's ``AsyncResult`` of it.

    A message whose ETA lies more than ``park_after`` ahead is stored with
    ``available_at`` at its ETA, so no broker or worker holds it while it waits.
    ``now`` is the database's clock (``OutboxStore.now``): a ``countdown`` is counted
    from it, an ``eta`` is the caller's wall time and kept as given.
    With ``lease``, a message due now is born leased (``locked_until``) for that long
    to the publisher that will publish it on commit. The trace context current at the
    call, if any, is stored in the message headers (:mod:`celery_outbox.tracing`).
    ``validate`` checks what the
    caller gave (see :mod:`celery_outbox.dispatch.validation`); a worker re-dispatching a message
    that was checked when it was first sent passes ``False``.

    Raises
    ------
    PayloadError
        When the message cannot be serialised or stored, or exceeds ``max_bytes``.
    """
    app = task.app
    check_schedule(options, now=now, tz=app.timezone)
    options = with_context(options)  # the request's trace, stored with the row
    body, publish, result = capture_message(task, args, kwargs, task_id=task_id, options=options)
    serializer = publish.get("serializer") or app.conf.task_serializer
    payload, content = serialise_body(
        task.name,
        body,
        serializer=serializer,
        compression=publish.get("compression"),
        max_bytes=max_bytes,
        accept=app.conf.accept_content,
    )
    if validate:
        check_argument_depth(
            task.name,
            tuple(args or ()),
            dict(kwargs or {}),
            payload=payload,
            content_type=content["content_type"],
        )
    headers = with_storable_reprs(publish.get("headers") or {})
    available_at = _available_at(
        headers.get("eta"),
        countdown=options.get("countdown"),
        now=now,
        park_after=park_after,
        tz=app.timezone,
    )
    message = NewMessage(
        task_id=headers.get("id", task_id),
        task_name=task.name,
        payload=payload,
        options=_stored_options(publish, headers, content),
        available_at=available_at,
        locked_until=now + lease if lease is not None and available_at <= now else None,
    )
    if validate:
        check_message(message, max_bytes=max_bytes)
    return Call(message, result)


_NOT_PROPERTIES = frozenset(
    {
        "exchange",
        "routing_key",
        "serializer",
        "compression",
        "retry",
        "retry_policy",
        "delivery_mode",
        "declare",
        "headers",
        "timeout",
        "confirm_timeout",
    }
)


def _stored_options(
    publish: Mapping[str, Any], headers: dict[str, Any], content: Mapping[str, Any]
) -> dict[str, Any]:
    exchange = publish.get("exchange")
    return {
        "exchange": getattr(exchange, "name", exchange) or "",
        "routing_key": publish.get("routing_key") or "",
        "delivery_mode": publish.get("delivery_mode"),
        "declare": [getattr(q, "name", q) for q in publish.get("declare") or ()],
        "headers": headers,
        "properties": with_storable_reprs(
            {k: v for k, v in publish.items() if k not in _NOT_PROPERTIES}
        ),
        **content,
    }


def _available_at(
    eta: str | None, *, countdown: Any, now: datetime, park_after: timedelta, tz: tzinfo
) -> datetime:
    # A countdown is a wait from ``now`` (the database's clock), not from the ETA Celery
    # computed on this host's clock; an eta is the caller's wall time and stays as given.
    # As in Celery, a countdown wins over an eta.
    if countdown:
        when = now + timedelta(seconds=countdown)
    elif eta:
        when = as_datetime("eta", eta, tz=tz)
    else:
        return now
    return when if when - now > park_after else now


def publish_body(payload: str, options: Mapping[str, Any]) -> bytes:
    """The exact bytes to hand to ``Producer.publish`` for a stored payload."""
    if options.get("body_encoding") == BODY_ENCODING_BASE64:
        return base64.b64decode(payload)
    return payload.encode(options.get("content_encoding") or "utf-8")


def publish_headers(options: Mapping[str, Any]) -> dict[str, Any]:
    """The headers to publish a stored message with (a copy: the row's stay as stored)."""
    headers = dict(options.get("headers") or {})
    if "compression" in options:
        headers["compression"] = options["compression"]
    return headers


def decode_body(
    payload: str,
    options: Mapping[str, Any],
    *,
    accept: Collection[str] | None,
    max_bytes: int | None,
) -> Any:
    """Decode a stored payload back into the Celery message body ``(args, kwargs, embed)``.

    A row's content type and compression are whatever was written to the table, so
    neither is trusted: a content type outside ``accept`` is refused before anything
    is decoded (a pickle row is never unpickled by a JSON-only app), and a compressed
    body is inflated to at most ``max_bytes``.

    Parameters
    ----------
    accept
        Serializer names or content types accepted (Celery's ``accept_content``);
        ``None`` accepts Celery's default, JSON only.
    max_bytes
        Largest inflated body (``outbox_max_payload_bytes``); ``None`` for no limit.

    Raises
    ------
    PayloadError
        When the content type is not accepted, or the body is compressed with a codec
        that cannot be inflated in bounded steps or inflates beyond ``max_bytes``.
    """
    content_type = options.get("content_type")
    accepted = prepare_accept_content(accept or ["json"]) or set()
    if content_type not in accepted:
        raise PayloadError(
            f"content type {content_type!r} is not accepted (accept_content="
            f"{sorted(accepted)}); the body was not decoded."
        )
    raw = publish_body(payload, options)
    if "compression" in options:
        raw = inflate(raw, options["compression"], max_bytes=max_bytes)
    return loads(raw, content_type, options["content_encoding"], accept=accepted)
