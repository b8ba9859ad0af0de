"""The AOF reader and the loss attribution, on synthetic Redis 7 append-only files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.reliability import aof
from tests.reliability.attribution import attribute, message_id

QUEUE = "q"


def resp(*args: str | bytes) -> bytes:
    """One command in RESP, as Redis writes it to the AOF."""
    out = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        raw = arg.encode() if isinstance(arg, str) else arg
        out.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    return b"".join(out)


def envelope(task_id: str) -> bytes:
    """A kombu message as its Redis transport stores it (headers are plain JSON)."""
    headers = {"id": task_id, "argsrepr": repr((task_id,)), "task": "record"}
    return json.dumps({"body": "W1tdXQ==", "headers": headers, "properties": {}}).encode()


def unacked(task_id: str) -> bytes:
    return json.dumps([json.loads(envelope(task_id)), "", QUEUE]).encode()


def write_aof(directory: Path, base: bytes, *increments: bytes) -> Path:
    """An ``appendonlydir/`` with a manifest, one base file and ``increments``."""
    directory.mkdir()
    lines = ["file appendonly.aof.1.base.aof seq 1 type b"]
    (directory / "appendonly.aof.1.base.aof").write_bytes(base)
    for seq, data in enumerate(increments, start=1):
        name = f"appendonly.aof.{seq}.incr.aof"
        (directory / name).write_bytes(data)
        lines.append(f"file {name} seq {seq} type i")
    lines.append("file appendonly.aof.0.base.aof seq 0 type h")  # history: not replayed
    (directory / aof.MANIFEST).write_text("\n".join(lines) + "\n")
    return directory


def test_reads_base_then_increments_with_timestamps_and_drops_a_torn_tail(
    tmp_path: Path,
) -> None:
    directory = write_aof(
        tmp_path / "appendonlydir",
        b"#TS:990\r\n",
        resp("SELECT", "0") + resp("LPUSH", QUEUE, "a", "b") + b"#TS:999\r\n" + resp("RPOP", QUEUE),
        resp("RPUSH", QUEUE, "c") + resp("RPOP", QUEUE)[:-3],  # killed mid-write
    )
    commands = aof.read_commands(directory)
    assert [c.args for c in commands] == [
        (b"SELECT", b"0"),
        (b"LPUSH", b"q", b"a", b"b"),
        (b"RPOP", b"q"),
        (b"RPUSH", b"q", b"c"),
    ]
    assert [c.timestamp for c in commands] == [990, 990, 999, 999]


def test_keeps_a_transaction_only_with_its_exec() -> None:
    data = resp("MULTI") + resp("RPUSH", QUEUE, "a") + resp("EXEC")
    data += resp("MULTI") + resp("RPUSH", QUEUE, "b")  # EXEC never written
    assert [c.args for c in aof.parse(data)] == [(b"RPUSH", b"q", b"a")]


def test_rejects_an_rdb_preamble_and_a_missing_manifest(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no AOF manifest"):
        aof.read_commands(tmp_path)
    directory = write_aof(tmp_path / "appendonlydir", b"REDIS0010...")
    with pytest.raises(ValueError, match="aof-use-rdb-preamble no"):
        aof.read_commands(directory)


def test_replay_finds_the_values_that_pops_and_moves_took() -> None:
    data = (
        resp("LPUSH", QUEUE, "a", "b", "c")  # list: c b a
        + resp("RPOP", QUEUE)  # a
        + resp("LMOVE", QUEUE, "other", "LEFT", "RIGHT")  # c
        + resp("RPOPLPUSH", QUEUE, "other")  # b
        + resp("RPUSH", QUEUE, "d", "e")
        + resp("LPOP", QUEUE, "2")  # d e
        + resp("HSET", "unacked", "tag", "x")
        + resp("HDEL", "unacked", "tag", "missing")
        + resp("SELECT", "1")
        + resp("RPUSH", QUEUE, "elsewhere")
    )
    moved = [(op.kind, op.key, op.value) for op in aof.replay(aof.parse(data))]
    assert moved == [
        ("push", b"q", b"a"),
        ("push", b"q", b"b"),
        ("push", b"q", b"c"),
        ("pop", b"q", b"a"),
        ("pop", b"q", b"c"),
        ("push", b"other", b"c"),
        ("pop", b"q", b"b"),
        ("push", b"other", b"b"),
        ("push", b"q", b"d"),
        ("push", b"q", b"e"),
        ("pop", b"q", b"d"),
        ("pop", b"q", b"e"),
        ("hset", b"unacked", b"x"),
        ("hdel", b"unacked", b"x"),
    ]


def test_message_id_reads_envelopes_and_unacked_entries() -> None:
    assert message_id(envelope("c1-2")) == "c1-2"
    assert message_id(unacked("c1-2")) == "c1-2"
    assert message_id(b"not json") is None


def test_attribution_separates_outbox_losses_from_the_consumer_window() -> None:
    before_kill = (
        resp("LPUSH", QUEUE, envelope("ran"), envelope("window"), envelope("early"))
        + resp("RPOP", QUEUE)  # ran, delivered: parked in unacked, then acked
        + resp("MULTI")
        + resp("HSET", "unacked", "t1", unacked("ran"))
        + resp("EXEC")
        + resp("HDEL", "unacked", "t1")
        + resp("RPOP", QUEUE)  # window, popped once, then pushed back
        + resp("LPUSH", QUEUE, envelope("window"))
        + resp("LPUSH", QUEUE, envelope("queued"))
        + resp("RPOP", QUEUE)  # early: popped before the last pop, never seen again
        + resp("RPOP", QUEUE)  # window: the last pop before the kill
        + resp("LPUSH", QUEUE, envelope("late"))
    )
    kill = len(aof.parse(before_kill))
    after_restart = resp("SELECT", "0") + resp("RPOP", QUEUE)  # late: popped after the restart
    lost = {"never-pushed", "window", "early", "queued", "ran", "late"}
    ops = aof.replay(aof.parse(before_kill + after_restart))
    blame = attribute(lost, ops, queue=QUEUE, kills=[kill])
    assert blame.by_outbox == {"never-pushed"}
    assert blame.past_broker == {"window"}
    assert blame.unexplained == {"early", "queued", "ran", "late"}
    assert blame.history["window"].startswith("past_broker: push(queue)@None#0")
    assert blame.history["never-pushed"] == "by_outbox: no AOF op"


def test_attribution_allows_no_window_without_a_kill() -> None:
    data = resp("LPUSH", QUEUE, envelope("k")) + resp("RPOP", QUEUE)
    blame = attribute({"k"}, aof.replay(aof.parse(data)), queue=QUEUE, kills=[])
    assert blame.unexplained == {"k"}


def test_attribution_counts_a_last_pop_parked_in_unacked_as_unexplained() -> None:
    data = resp("LPUSH", QUEUE, envelope("k")) + resp("RPOP", QUEUE)
    data += resp("HSET", "unacked", "t1", unacked("k"))
    blame = attribute({"k"}, aof.replay(aof.parse(data)), queue=QUEUE, kills=[3])
    assert blame.unexplained == {"k"}


def test_attribution_finds_a_non_envelope_value_by_its_key_text() -> None:
    data = resp("LPUSH", QUEUE, b"raw ('k',) payload") + resp("RPOP", QUEUE)
    blame = attribute({"k"}, aof.replay(aof.parse(data)), queue=QUEUE, kills=[2])
    assert blame.past_broker == {"k"}
