"""The on-disk spool: order, acknowledgement, its bound, surviving a restart, and healing
from refused writes and corrupt files."""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path

import pytest

import fabricprobe.agent.spool as spool_mod
from fabricprobe.agent.spool import (
    QUARANTINE_DIR,
    Spool,
    SpoolCorrupt,
    SpoolKey,
    decode_record,
    decode_window,
    encode_record,
)
from fabricprobe.core.api import fabricprobe_pb2 as pb


def test_fifo_ack_and_reopen(tmp_path: Path) -> None:
    sp = Spool(tmp_path)
    for seq in (1, 2, 3):
        sp.put(SpoolKey(5, seq), b"w%d" % seq)
    sp.put(SpoolKey(4, 9), b"older lifetime")
    assert sp.pending() == [SpoolKey(4, 9), SpoolKey(5, 1), SpoolKey(5, 2), SpoolKey(5, 3)]
    sp.ack(SpoolKey(5, 1))
    sp.ack(SpoolKey(5, 1))  # twice is harmless
    assert sp.read(SpoolKey(5, 1)) is None
    (tmp_path / "x.tmp").write_bytes(b"torn")
    again = Spool(tmp_path)
    assert again.pending() == [SpoolKey(4, 9), SpoolKey(5, 2), SpoolKey(5, 3)]
    assert again.read(SpoolKey(5, 2)) == b"w2"
    assert again.size_bytes == len(b"older lifetime") + 4 + 3 * 12  # 12-byte headers
    assert not (tmp_path / "x.tmp").exists()


def test_bound_in_windows_drops_oldest(tmp_path: Path) -> None:
    sp = Spool(tmp_path, max_windows=3)
    for seq in range(1, 6):
        sp.put(SpoolKey(1, seq), b"x")
    assert [k.seq for k in sp.pending()] == [3, 4, 5]
    assert sp.dropped == 2 and sp.depth == 3
    assert len(list(tmp_path.iterdir())) == 3


def test_bound_in_bytes_drops_oldest(tmp_path: Path) -> None:
    sp = Spool(tmp_path, max_bytes=120)  # each file: 12-byte header + 40 bytes
    for seq in range(1, 5):
        sp.put(SpoolKey(1, seq), b"y" * 40)
    assert [k.seq for k in sp.pending()] == [3, 4]
    assert sp.size_bytes == 104 and sp.dropped == 2
    assert sp.put(SpoolKey(1, 9), b"z" * 200) is False  # too big: dropped, counted
    assert sp.dropped == 3 and SpoolKey(1, 9) not in sp.pending()


def test_reopening_with_a_smaller_bound_trims(tmp_path: Path) -> None:
    sp = Spool(tmp_path)
    for seq in range(1, 6):
        sp.put(SpoolKey(1, seq), b"x")
    small = Spool(tmp_path, max_windows=2)
    assert [k.seq for k in small.pending()] == [4, 5] and small.dropped == 3


def test_a_refused_write_is_held_in_memory_then_spooled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write = spool_mod._write_file
    full = {"on": True}

    def refusing(path: Path, data: bytes) -> None:
        if full["on"]:
            raise OSError(errno.EIO, "Input/output error")
        write(path, data)

    monkeypatch.setattr(spool_mod, "_write_file", refusing)
    sp = Spool(tmp_path, max_memory_windows=3)
    for seq in range(1, 6):
        assert sp.put(SpoolKey(1, seq), b"w%d" % seq) is False
    assert sp.write_failures == 5 and sp.dropped == 2 and sp.in_memory == 3
    assert sp.pending() == [SpoolKey(1, 3), SpoolKey(1, 4), SpoolKey(1, 5)]
    assert sp.read(SpoolKey(1, 4)) == b"w4"
    sp.ack(SpoolKey(1, 4))
    assert "Input/output error" in (sp.last_error or "")
    full["on"] = False
    assert sp.put(SpoolKey(1, 6), b"w6") is True
    assert sp.in_memory == 0 and [k.seq for k in Spool(tmp_path).pending()] == [3, 5, 6]


@pytest.mark.parametrize(
    "mangle",
    [
        lambda b: b[:5],  # shorter than the header
        lambda b: b"NOPE" + b[4:],  # wrong header
        lambda b: b[:-1],  # truncated payload
        lambda b: b[:-1] + bytes([b[-1] ^ 1]),  # one bit flipped
    ],
)
def test_corrupt_files_are_quarantined_within_a_bound(
    tmp_path: Path, mangle: Callable[[bytes], bytes]
) -> None:
    sp = Spool(tmp_path, max_quarantine=2)
    for seq in range(1, 5):
        sp.put(SpoolKey(1, seq), b"payload %d" % seq)
    for seq in range(1, 4):
        f = tmp_path / SpoolKey(1, seq).filename
        f.write_bytes(mangle(f.read_bytes()))
        assert sp.read(SpoolKey(1, seq)) is None
    assert sp.quarantined == 3 and sp.pending() == [SpoolKey(1, 4)]
    kept = sorted(p.name for p in (tmp_path / QUARANTINE_DIR).iterdir())
    assert kept == [SpoolKey(1, 2).filename, SpoolKey(1, 3).filename]


def test_decode_window_checks_protobuf_and_key() -> None:
    report = pb.WindowReport(host="h", epoch=7, seq=2).SerializeToString()
    assert decode_window(report, SpoolKey(7, 2)).host == "h"
    with pytest.raises(SpoolCorrupt, match="not 7-3"):
        decode_window(report, SpoolKey(7, 3))
    with pytest.raises(SpoolCorrupt, match="not a WindowReport"):
        decode_window(b"\x0a\xff\xff\xff\xff\x0f")
    with pytest.raises(SpoolCorrupt):
        decode_record(encode_record(b"abc")[:-1])
