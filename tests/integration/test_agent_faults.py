"""Agent faults that must heal, against a real gRPC collector on loopback: a full disk
under the spool, corrupt spool files, a thread that dies, kill -9 of the agent process
mid-stream, and a collector restart mid-stream. Each test records windows sent,
accepted, lost and double-counted in the suite's figures."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import fabricprobe.agent.spool as spool_mod
from fabricprobe.agent.agent import EX_SOFTWARE, FAILURES_FILE, Agent
from fabricprobe.agent.spool import QUARANTINE_DIR
from fabricprobe.cli import main
from fabricprobe.collector.service import CollectorServer
from tests.conftest import Figures
from tests.integration.test_loopback_fleet import (
    HOSTS,
    agent_config,
    free_port,
    server_config,
    wait_for,
)


def _taken(*servers: CollectorServer, host: str) -> dict[int, set[int]]:
    out: dict[int, set[int]] = {}
    for s in servers:
        for epoch, seqs in s.store.seqs_taken(host).items():
            out.setdefault(epoch, set()).update(seqs)
    return out


def _double_counted(*servers: CollectorServer) -> int:
    """Reports merged beyond the distinct windows each collector holds."""
    extra = 0
    for s in servers:
        snap = s.store.snapshot()
        distinct = sum(len(seqs) for h in snap.hosts for seqs in s.store.seqs_taken(h).values())
        extra += snap.reports_total - distinct
    return extra


@contextlib.contextmanager
def small_disk(path: Path) -> Iterator[bool]:
    """A 64 KiB tmpfs at PATH when the kernel lets us mount one (True), else a plain dir."""
    path.mkdir(parents=True)
    mounted = False
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(path)],
            capture_output=True,
            check=False,
        )
        mounted = r.returncode == 0
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(path)], check=False)


def _fill(directory: Path) -> Path:
    """Write a filler file until the filesystem says ENOSPC."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            assert e.errno == errno.ENOSPC
    return filler


def test_full_disk_keeps_reporting_and_spooling_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, figures: Figures
) -> None:
    server = CollectorServer(server_config())
    server.start()
    disk = tmp_path / "disk"
    with small_disk(disk) as real:
        cfg = agent_config(tmp_path, HOSTS[0], server.port)
        cfg.spool_dir = str(disk / "spool")
        agent = Agent(cfg)
        full = {"on": False}
        if not real:  # no mount allowed: refuse writes at the file boundary instead
            write = spool_mod._write_file

            def refusing(path: Path, data: bytes) -> None:
                if full["on"]:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
                write(path, data)

            monkeypatch.setattr(spool_mod, "_write_file", refusing)
        agent.start()
        try:
            wait_for(lambda: agent.sender.acked >= 1, what="a first window acknowledged")
            filler = _fill(disk) if real else None
            full["on"] = True
            seq_full = agent.seq
            acked_full = agent.sender.acked
            wait_for(
                lambda: agent.spool.write_failures >= 3 and agent.sender.acked >= acked_full + 3,
                what="windows acknowledged while the disk is full",
            )
            failures = agent.spool.write_failures
            assert agent.seq >= seq_full + 3
            if filler is not None:
                filler.unlink()
            full["on"] = False
            seq_free = agent.seq
            wait_for(
                lambda: agent.seq >= seq_free + 2 and agent.spool.in_memory == 0,
                what="spooling resumed once space returned",
            )
            on_disk = agent.spool.write_failures == failures
        finally:
            agent.close()
            time.sleep(0.2)
            taken = _taken(server, host=cfg.host).get(agent.epoch, set())
            doubles = _double_counted(server)
            server.stop(0)
    lost = set(range(1, agent.seq + 1)) - taken
    figures.record(
        "disk full (" + ("tmpfs 64 KiB" if real else "ENOSPC injected at the write") + ")",
        windows_sent=agent.seq,
        accepted=len(taken),
        lost=len(lost),
        double_counted=doubles,
        write_failures=failures,
    )
    assert not lost, f"windows lost to the full disk: {sorted(lost)}"
    assert on_disk and failures >= 3 and doubles == 0


def test_corrupt_spool_files_are_quarantined(tmp_path: Path, figures: Figures) -> None:
    dead = free_port()
    cfg = agent_config(tmp_path, HOSTS[1], dead)
    first = Agent(cfg)
    first.start()
    for _ in range(5):
        first.cut_window()
    first.close(flush_timeout=0.1)
    spool_dir = Path(cfg.spool_dir)
    files = sorted(spool_dir.glob("*.win"))
    assert len(files) >= 5
    # Protobuf garbage, a torn file, a foreign header: three ways a spool file goes bad.
    files[0].write_bytes(b"\x0a\xff\xff\xff\xff\x0f")
    files[1].write_bytes(files[1].read_bytes()[:-7])
    files[2].write_bytes(b"XXXX" + files[2].read_bytes()[4:])
    good = len(files) - 3
    server = CollectorServer(server_config(dead))
    server.start()
    second = Agent(agent_config(tmp_path, HOSTS[1], dead))
    second.start()
    try:
        wait_for(
            lambda: second.spool.quarantined == 3 and second.spool.depth == 0,
            what="corrupt files quarantined and the rest sent",
        )
        wait_for(lambda: second.sender.acked >= good + 1, what="windows after the corrupt ones")
    finally:
        second.close()  # must not raise on the corrupt files
        taken = _taken(server, host=cfg.host)
        doubles = _double_counted(server)
        server.stop(0)
    old = taken.get(first.epoch, set())
    kept = sorted(p.name for p in (spool_dir / QUARANTINE_DIR).iterdir())
    figures.record(
        "corrupt spool files",
        windows_sent=first.seq,
        accepted=len(old),
        lost=first.seq - len(old) - 3,
        quarantined=second.spool.quarantined,
        double_counted=doubles,
    )
    assert kept == sorted(f.name for f in files[:3])
    assert old == set(range(1, first.seq + 1)) - {int(f.name[21:41]) for f in files[:3]}
    assert second.failure is None and doubles == 0


def test_a_dead_thread_stops_the_agent_and_is_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = agent_config(tmp_path, HOSTS[2], free_port())
    agent = Agent(cfg)
    calls = {"n": 0}
    real = agent.sampler.sample

    def breaking() -> list:  # type: ignore[type-arg]
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("sampler bug")
        return real()

    monkeypatch.setattr(agent.sampler, "sample", breaking)
    agent.start()
    try:
        assert agent.wait(10.0), "the agent kept running with a dead window thread"
    finally:
        agent.close()
    assert agent.failure is not None and agent.failure.startswith("windows: RuntimeError")
    assert (Path(cfg.spool_dir) / FAILURES_FILE).exists()
    again = Agent(agent_config(tmp_path, HOSTS[2], free_port()))
    key = again.cut_window()
    data = again.spool.read(key)
    assert data is not None
    assert spool_mod.decode_window(data).agent.thread_failures == 1


def test_cli_exits_non_zero_when_a_thread_dies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fabricprobe.agent import counters

    def broken(self: object) -> list:  # type: ignore[type-arg]
        raise RuntimeError("sampler bug")

    monkeypatch.setattr(counters.CounterSampler, "sample", broken)
    monkeypatch.setattr(signal, "signal", lambda *a: None)  # keep pytest's own handlers
    conf = tmp_path / "agent.toml"
    conf.write_text("[agent]\nwindow_s = 0.3\n")
    res = CliRunner().invoke(
        main,
        [
            "agent",
            "--config",
            str(conf),
            "--collector",
            f"127.0.0.1:{free_port()}",
            "--insecure",
            "--listen",
            "127.0.0.5:0",
            "--spool-dir",
            str(tmp_path / "spool"),
            "--sysfs",
            str(tmp_path / "none"),
            "--no-ethtool",
        ],
    )
    assert res.exit_code == EX_SOFTWARE, res.output
    assert "agent thread died: windows" in res.output


def _agent_proc(tmp: Path, name: str, api: int, address: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fabricprobe",
            "agent",
            "--collector",
            f"127.0.0.1:{api}",
            "--insecure",
            "--host",
            name,
            "--listen",
            f"{address}:0",
            "--spool-dir",
            str(tmp / name),
            "--sysfs",
            str(tmp / "none"),
            "--no-ethtool",
        ],
        stderr=subprocess.DEVNULL,
    )


def _end(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def test_kill_9_of_the_agent_mid_stream_then_replay(tmp_path: Path, figures: Figures) -> None:
    port = free_port()
    server = CollectorServer(server_config(port))
    server.start()
    name = "kill9"
    first = _agent_proc(tmp_path, name, port, HOSTS[0])
    second = None
    try:
        wait_for(lambda: sum(map(len, _taken(server, host=name).values())) >= 3, what="windows")
        server.stop(0)  # the collector goes away, so windows pile up in the spool ...
        time.sleep(2.5)
        first.send_signal(signal.SIGKILL)  # ... and the agent dies without a word
        first.wait()
        assert first.returncode == -signal.SIGKILL
        spooled = {p.name for p in (tmp_path / name).glob("*.win")}
        assert spooled, "nothing was spooled during the outage"
        epoch = {int(s[:20]) for s in spooled}
        assert len(epoch) == 1
        cut = max(int(s[21:41]) for s in spooled)
        server2 = CollectorServer(server_config(port))
        server2.start()
        second = _agent_proc(tmp_path, name, port, HOSTS[0])
        (old_epoch,) = epoch
        wait_for(
            lambda: (
                set(range(1, cut + 1)) <= _taken(server, server2, host=name).get(old_epoch, set())
            ),
            what="the killed lifetime's windows replayed",
        )
    finally:
        for p in (first, second):
            if p is not None:
                _end(p)
        server.stop(0)
    taken = _taken(server, server2, host=name).get(old_epoch, set())
    doubles = _double_counted(server, server2)
    server2.stop(0)
    lost = set(range(1, cut + 1)) - taken
    figures.record(
        "kill -9 of the agent, then replay",
        windows_sent=cut,
        accepted=len(taken & set(range(1, cut + 1))),
        lost=len(lost),
        double_counted=doubles,
        replayed=len(spooled),
    )
    assert not lost and doubles == 0


def test_collector_restart_mid_stream_real_agent(tmp_path: Path, figures: Figures) -> None:
    port = free_port()
    first = CollectorServer(server_config(port))
    first.start()
    name = "restart"
    proc = _agent_proc(tmp_path, name, port, HOSTS[1])
    second = None
    try:
        wait_for(lambda: sum(map(len, _taken(first, host=name).values())) >= 2, what="windows")
        first.stop(0)
        time.sleep(2.0)
        second = CollectorServer(server_config(port))
        second.start()
        wait_for(
            lambda: sum(map(len, _taken(second, host=name).values())) >= 4,  # type: ignore[arg-type]
            what="windows to the restarted collector",
        )
    finally:
        _end(proc)
    assert proc.returncode == 0
    time.sleep(0.2)
    assert second is not None
    taken = _taken(first, second, host=name)
    doubles = _double_counted(first, second)
    second.stop(0)
    (epoch,) = taken
    seqs = taken[epoch]
    sent = max(seqs)
    lost = set(range(1, sent + 1)) - seqs
    leftover = list((tmp_path / name).glob("*.win"))
    figures.record(
        "collector restart mid-stream",
        windows_sent=sent,
        accepted=len(seqs),
        lost=len(lost),
        double_counted=doubles,
    )
    assert not lost and not leftover and doubles == 0
