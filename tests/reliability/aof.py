"""Read a Redis 7 append-only file and replay its list and hash operations.

The AOF is the broker's own durable record of what it accepted: with ``appendfsync
always`` a write reaches it before the client gets its reply. Redis 7 keeps it in an
``appendonlydir/`` (a manifest, one base file and incremental files, all in RESP). A
blocking pop is propagated as the plain pop it performed (``BRPOP`` as ``RPOP``,
``BLMOVE`` as ``LMOVE``), without the value, so the values are found by replaying the
lists from the start. With ``aof-timestamp-enabled`` Redis writes ``#TS:<unix seconds>``
annotations, which date each operation to the second.

:func:`read_commands` parses the files; :func:`replay` turns the commands into
:class:`Op` records (which value entered or left which list, which hash field was set or
deleted). Only what kombu's Redis transport uses is replayed; other commands are skipped.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

#: The name of Redis 7's manifest inside ``appendonlydir/``.
MANIFEST = "appendonly.aof.manifest"

OpKind = Literal["push", "pop", "hset", "hdel"]


@dataclass(frozen=True, kw_only=True)
class Command:
    """One command of the AOF: its arguments and the last ``#TS`` annotation before it."""

    args: tuple[bytes, ...]
    timestamp: int | None

    @property
    def name(self) -> str:
        """The command's name, upper case."""
        return self.args[0].decode().upper()


@dataclass(frozen=True, kw_only=True)
class Op:
    """A value entering (``push``/``hset``) or leaving (``pop``/``hdel``) a list or hash."""

    kind: OpKind
    key: bytes
    value: bytes
    timestamp: int | None
    index: int


def aof_files(directory: Path) -> list[Path]:
    """The base and incremental files named by ``directory``'s manifest, in replay order."""
    manifest = directory / MANIFEST
    if not manifest.exists():
        raise FileNotFoundError(f"no AOF manifest {manifest}: is appendonly enabled (Redis 7)?")
    base: list[Path] = []
    incr: list[tuple[int, Path]] = []
    for line in manifest.read_text().splitlines():
        fields = line.split()
        info = dict(zip(fields[::2], fields[1::2], strict=False))
        if info.get("type") == "b":
            base.append(directory / info["file"])
        elif info.get("type") == "i":
            incr.append((int(info["seq"]), directory / info["file"]))
    return base + [path for _seq, path in sorted(incr)]


def read_commands(directory: Path) -> list[Command]:
    """Every command of the AOF in ``directory`` (a Redis 7 ``appendonlydir/``)."""
    parts = [path.read_bytes() for path in aof_files(directory)]
    if parts and parts[0].startswith(b"REDIS"):
        raise ValueError(
            f"{directory} has an RDB preamble: run Redis with --aof-use-rdb-preamble no"
        )
    # One stream: an incremental file continues the previous file's #TS second, and Redis
    # truncates an incomplete tail when it loads the files, so only the last can have one.
    return parse(b"".join(parts))


def parse(data: bytes) -> list[Command]:
    """The commands of RESP ``data``; an incomplete tail (a crash mid-write) is dropped.

    Commands between ``MULTI`` and ``EXEC`` are kept (without those two) only when the
    ``EXEC`` is there, as Redis does when it loads a truncated file.
    """
    commands: list[Command] = []
    pending: list[Command] | None = None
    for command in _commands(data):
        if command.name == "MULTI":
            pending = []
        elif command.name == "EXEC":
            commands.extend(pending or [])
            pending = None
        elif pending is not None:
            pending.append(command)
        else:
            commands.append(command)
    return commands


def _commands(data: bytes) -> Iterator[Command]:
    position, timestamp = 0, None
    while position < len(data):
        end = data.find(b"\r\n", position)
        if end < 0:
            return
        line = data[position:end]
        if line.startswith(b"#TS:"):
            timestamp = int(line[4:])
            position = end + 2
            continue
        if not line.startswith(b"*"):
            raise ValueError(f"not RESP at byte {position}: {line[:40]!r}")
        args, position = _arguments(data, end + 2, int(line[1:]))
        if args is None:
            return
        yield Command(args=args, timestamp=timestamp)


def _arguments(data: bytes, position: int, count: int) -> tuple[tuple[bytes, ...] | None, int]:
    args: list[bytes] = []
    for _ in range(count):
        end = data.find(b"\r\n", position)
        if end < 0 or not data.startswith(b"$", position):
            return None, position
        length = int(data[position + 1 : end])
        start = end + 2
        if start + length + 2 > len(data):
            return None, position
        args.append(data[start : start + length])
        position = start + length + 2
    return tuple(args), position


class _State:
    """The lists and hashes of every database, as the commands leave them."""

    def __init__(self) -> None:
        self.lists: dict[tuple[int, bytes], deque[bytes]] = {}
        self.hashes: dict[tuple[int, bytes], dict[bytes, bytes]] = {}
        self.db = 0

    def lst(self, key: bytes) -> deque[bytes]:
        return self.lists.setdefault((self.db, key), deque())

    def hsh(self, key: bytes) -> dict[bytes, bytes]:
        return self.hashes.setdefault((self.db, key), {})


def replay(commands: Iterable[Command], *, db: int = 0) -> list[Op]:
    """The list and hash operations of database ``db``, in order, with the values moved."""
    state, ops = _State(), []
    for index, command in enumerate(commands):
        for kind, key, value in _apply(state, command):
            if state.db == db:
                ops.append(
                    Op(kind=kind, key=key, value=value, timestamp=command.timestamp, index=index)
                )
    return ops


def _apply(state: _State, command: Command) -> Iterator[tuple[OpKind, bytes, bytes]]:
    name, args = command.name, command.args[1:]
    if name == "SELECT":
        state.db = int(args[0])
    elif name in ("LPUSH", "RPUSH", "LPUSHX", "RPUSHX"):
        items = state.lst(args[0])
        for value in args[1:]:
            _put(items, value, left=name.startswith("L"))
            yield "push", args[0], value
    elif name in ("LPOP", "RPOP"):
        items = state.lst(args[0])
        for _ in range(int(args[1]) if len(args) > 1 else 1):
            if items:
                yield "pop", args[0], items.popleft() if name == "LPOP" else items.pop()
    elif name in ("LMOVE", "RPOPLPUSH"):
        where = args[2:4] if name == "LMOVE" else (b"RIGHT", b"LEFT")
        source = state.lst(args[0])
        if source:
            value = source.popleft() if where[0].upper() == b"LEFT" else source.pop()
            yield "pop", args[0], value
            _put(state.lst(args[1]), value, left=where[1].upper() == b"LEFT")
            yield "push", args[1], value
    elif name in ("HSET", "HMSET"):
        fields = state.hsh(args[0])
        for field, value in zip(args[1::2], args[2::2], strict=True):
            fields[field] = value
            yield "hset", args[0], value
    elif name == "HDEL":
        fields = state.hsh(args[0])
        for field in args[1:]:
            if field in fields:
                yield "hdel", args[0], fields.pop(field)
    elif name in ("DEL", "UNLINK"):
        yield from _delete(state, args)


def _put(items: deque[bytes], value: bytes, *, left: bool) -> None:
    if left:
        items.appendleft(value)
    else:
        items.append(value)


def _delete(state: _State, keys: Iterable[bytes]) -> Iterator[tuple[OpKind, bytes, bytes]]:
    for key in keys:
        for value in state.lists.pop((state.db, key), deque()):
            yield "pop", key, value
        for value in state.hashes.pop((state.db, key), {}).values():
            yield "hdel", key, value
