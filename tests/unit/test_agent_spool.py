"""The on-disk spool: order, acknowledgement, its bound, and surviving a restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from fabricprobe.agent.spool import Spool, SpoolKey


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
    assert again.size_bytes == len(b"older lifetime") + 4
    assert not (tmp_path / "x.tmp").exists()


def test_bound_in_windows_drops_oldest(tmp_path: Path) -> None:
    sp = Spool(tmp_path, max_windows=3)
    for seq in range(1, 6):
        sp.put(SpoolKey(1, seq), b"x")
    assert [k.seq for k in sp.pending()] == [3, 4, 5]
    assert sp.dropped == 2 and sp.depth == 3
    assert len(list(tmp_path.iterdir())) == 3


def test_bound_in_bytes_drops_oldest(tmp_path: Path) -> None:
    sp = Spool(tmp_path, max_bytes=100)
    for seq in range(1, 5):
        sp.put(SpoolKey(1, seq), b"y" * 40)
    assert [k.seq for k in sp.pending()] == [3, 4]
    assert sp.size_bytes == 80 and sp.dropped == 2
    with pytest.raises(ValueError, match="cannot fit"):
        sp.put(SpoolKey(1, 9), b"z" * 101)


def test_reopening_with_a_smaller_bound_trims(tmp_path: Path) -> None:
    sp = Spool(tmp_path)
    for seq in range(1, 6):
        sp.put(SpoolKey(1, seq), b"x")
    small = Spool(tmp_path, max_windows=2)
    assert [k.seq for k in small.pending()] == [4, 5] and small.dropped == 3
