"""How an RDMA prober opens its session (fabricprobe.probes.rdma.rc.prober_session), for RC
links, UD links and the KV sender, with the verbs objects faked: what the hello carries,
which device is used, and that everything opened is closed in order, on error too. The
runs on real devices are in the lane (tests/rdma)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pyverbs")

from fabricprobe.probes.control import RdmaEndpoint
from fabricprobe.probes.measure import LinkParams
from fabricprobe.probes.rdma import rc, ud

THEIRS = RdmaEndpoint(0x77, 5, "::ffff:192.0.2.2", 1, 0, 9, 0x1000, 1024)
OURS = RdmaEndpoint(0x42, 7, "::ffff:192.0.2.1", 1, 0, 8, 0x2000, 1024)


class FakeControl:
    def __init__(self, log: list[Any], fail: bool, *args: Any, **kw: Any) -> None:
        self.log, self.fail = log, fail
        log.append(("control", args, kw))

    def __enter__(self) -> FakeControl:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.log.append("control closed")

    def open(self, kind: str, params: dict[str, Any], *, deadline: Any = None) -> dict[str, Any]:
        self.log.append(("open", kind, params, deadline is not None))
        if self.fail:
            raise rc.PeerError("refused")
        return {"endpoint": THEIRS.as_dict()}

    def done(self, result: dict[str, Any], timeout: float | None = None) -> None:
        self.log.append(("done", result))


class FakeEndpoint:
    def __init__(self, log: list[Any], *args: Any, **kw: Any) -> None:
        self.log = log
        self.device = args[0] if args else "rxe0"
        log.append(("endpoint", args, kw))

    def __enter__(self) -> FakeEndpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.log.append("endpoint closed")

    def endpoint(self) -> RdmaEndpoint:
        return OURS

    def connect(self, remote: RdmaEndpoint) -> None:
        self.log.append(("connect", remote))

    def sender(self, remote: RdmaEndpoint) -> str:
        self.log.append(("sender", remote))
        return "wr"


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    state: dict[str, Any] = {"log": [], "fail": False}
    log = state["log"]

    def control(*args: Any, **kw: Any) -> FakeControl:
        return FakeControl(log, state["fail"], *args, **kw)

    def local_device(root: Any, source: str, device: str | None) -> tuple[str, int]:
        log.append(("device", str(root), source, device))
        return "rxe0", 3

    from fabricprobe.workload import transfer

    for module in (rc, ud, transfer):  # where each looks them up
        monkeypatch.setattr(module, "ControlClient", control, raising=False)
        monkeypatch.setattr(module, "local_device", local_device, raising=False)
        monkeypatch.setattr(
            module, "source_address", lambda h, p, b: b or "192.0.2.1", raising=False
        )
    monkeypatch.setattr(rc, "_endpoint", lambda *a, **kw: FakeEndpoint(log, *a, **kw))
    monkeypatch.setattr(ud, "_ud_endpoint", lambda *a, **kw: FakeEndpoint(log, *a, **kw))
    yield state


LINK = LinkParams("192.0.2.2", 4793, bind="192.0.2.1", engine="pyverbs", sysfs_root="/fake")


def test_an_rc_link_opens_its_session_with_a_connected_endpoint(fakes: dict[str, Any]) -> None:
    link = rc.RcPingLink(LINK, op="send", size=64, keepalive_s=5)
    _, _, remote = link._begin({"iters": 10})
    log = fakes["log"]
    assert log[0] == ("device", "/fake", "192.0.2.1", None)
    assert log[1] == (
        "control",
        ("192.0.2.2", 4793),
        {"bind": "192.0.2.1", "timeout": 30.0, "token": None},
    )
    assert log[2] == ("endpoint", ("pyverbs", "rxe0", 64, 3, "send"), {"receives": True})
    kind, params = log[3][1], log[3][2]
    assert kind == "rdma_rc_lat" and log[3][3] is True  # one deadline for the setup
    assert params == {
        "iters": 10,
        "keepalive_s": 5,
        "size": 64,
        "step_s": 2.0,
        "op": "send",
        "engine": "pyverbs",
        "endpoint": OURS.as_dict(),
    }
    assert list(params)[-3:] == ["op", "engine", "endpoint"]
    assert log[4] == ("connect", THEIRS) and remote == THEIRS
    link.close()
    assert log[-2:] == ["endpoint closed", "control closed"]


def test_a_ud_link_opens_its_session_and_builds_its_sender(fakes: dict[str, Any]) -> None:
    link = ud.UdLink(LINK, keepalive_s=0)
    _, _, wr = link._begin({"probes": 5})
    log = fakes["log"]
    assert log[0] == ("device", "/fake", "192.0.2.1", None)
    assert log[2] == ("endpoint", ("pyverbs", "rxe0", 3), {})
    assert log[3][1] == "rdma_ud" and log[3][3] is True
    assert log[3][2] == {
        "probes": 5,
        "keepalive_s": 0.0,
        "step_s": 0.5,
        "engine": "pyverbs",
        "endpoint": OURS.as_dict(),
    }
    assert log[4] == ("sender", THEIRS) and wr == "wr"
    link.close()
    assert log[-2:] == ["endpoint closed", "control closed"]


def test_a_refused_hello_closes_what_it_opened(fakes: dict[str, Any]) -> None:
    fakes["fail"] = True
    link = ud.UdLink(LINK)
    with pytest.raises(rc.PeerError, match="refused"):
        link._begin({"probes": 5})
    assert fakes["log"][-2:] == ["endpoint closed", "control closed"]
    assert not link.is_open


def test_the_kv_sender_opens_a_sink_session(
    fakes: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fabricprobe.probes.rdma import verbs
    from fabricprobe.workload.transfer import RdmaKvChannel

    log = fakes["log"]
    monkeypatch.setattr(verbs, "RcEndpoint", lambda *a, **kw: FakeEndpoint(log, *a, **kw))
    ch = RdmaKvChannel("192.0.2.2", 4793, bind="192.0.2.1", buffer=4096, sysfs_root="/fake")
    assert ch.device == "rxe0" and ch.remote == THEIRS
    assert log[0] == ("device", "/fake", "192.0.2.1", None)
    assert log[2] == ("endpoint", ("rxe0", 4096, rc.DEPTH, 3), {})
    assert log[3][1] == "kv_sink"
    assert log[3][2] == {
        "transport": "rdma",
        "chunk": 4096,
        "hold_s": 600,
        "endpoint": OURS.as_dict(),
    }
    assert log[4] == ("connect", THEIRS)
    ch.sent = 3
    ch.close()
    assert log[-3:] == [("done", {"transfers": 3}), "endpoint closed", "control closed"]


def test_a_kv_sender_refused_closes_what_it_opened(
    fakes: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fabricprobe.probes.rdma import verbs
    from fabricprobe.workload.transfer import RdmaKvChannel

    log = fakes["log"]
    fakes["fail"] = True
    monkeypatch.setattr(verbs, "RcEndpoint", lambda *a, **kw: FakeEndpoint(log, *a, **kw))
    with pytest.raises(rc.PeerError):
        RdmaKvChannel("192.0.2.2", 4793, bind="192.0.2.1", sysfs_root="/fake")
    assert "endpoint closed" in log and log[-1] == "control closed"
