"""report.rtt: the collector's Rtt reply (from a real store) into frames; hostile replies
cost only what cannot be read; a host reference is never a path."""

from __future__ import annotations

import math
import random
from typing import Any

import pandas as pd
import pytest

from fabricprobe.collector.rttquery import RttAsk, rtt_reply
from fabricprobe.collector.store import WindowStore
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.sketchwire import to_wire
from fabricprobe.core.stats import SlotTally
from fabricprobe.report import frames, rtt
from fabricprobe.report.sources import rtt_dict

S = 1_000_000_000


def fleet_doc(hosts: list[str], windows: int = 5, seed: int = 3, **ask: Any) -> dict[str, Any]:
    """The Rtt reply of a real store fed WINDOWS windows of every pair of HOSTS (each
    host's reference included), as `probe report` reads it."""
    now = [1_700_000_000 * S]
    store = WindowStore(stale_after=30, clock=lambda: now[0])
    for h in hosts:
        store.register(pb.HostInfo(host=h))
    rng = random.Random(seed)
    for seq in range(1, windows + 1):
        now[0] += S
        for i, s in enumerate(hosts):
            r = pb.WindowReport(host=s, epoch=1, seq=seq, window_end_unix_ns=now[0])
            for j, d in enumerate(hosts):
                sk = SlotTally()  # what an agent window builds
                mu = 9.5 if s == d else 10.5 + 0.1 * ((i + j) % 5)
                sk.record_many([int(rng.lognormvariate(mu, 0.4)) for _ in range(40)])
                r.probes.add(dst=d, transport="tcp", op="pingpong", size=64, rtt=to_wire(sk))
            store.take(r)
    return rtt_dict(rtt_reply(store, RttAsk(**{"max_paths": 2000, "cdf_paths": 40, **ask})))


def test_a_replys_paths_references_and_cdfs() -> None:
    doc = fleet_doc(["a", "b", "c"])
    got = rtt.rtt_frames(doc)
    assert len(got.paths) == 6 and len(got.references) == 3 and got.dropped == 0
    assert not (got.paths["src"] == got.paths["dst"]).any()
    assert (got.references["src"] == got.references["dst"]).all()
    assert list(got.paths["p99_s"]) == sorted(got.paths["p99_s"], reverse=True)
    assert (got.paths["exchanges"] == 200).all() and (got.paths["loss"] == 0).all()
    # the CDF read as the collector reads its sketch: the same figures
    sent = {(m["src"], m["dst"]): m for m in doc["paths"] + doc["host_references"]}
    for (src, dst), g in got.cdf.groupby(["src", "dst"]):
        m = sent[(str(src), str(dst))]
        assert g["total"].iloc[0] == g["cumulative"].iloc[-1] == m["count"]
        assert g["fraction"].iloc[-1] == 1.0 and (g["upper_s"] > g["lower_s"]).all()
        for q, name in ((0.5, "p50_s"), (0.9, "p90_s"), (0.99, "p99_s"), (0.999, "p999_s")):
            v = rtt.cdf_quantile(g, q, m["min_s"], m["max_s"])
            assert v == pytest.approx(m[name], rel=1e-9), (src, dst, name)
    assert "schema 6, each 1.09 % wide" in rtt.resolution(got.cdf)
    assert "merged" not in rtt.resolution(got.cdf)


def test_coarser_cdfs_are_said_so() -> None:
    got = rtt.rtt_frames(fleet_doc(["a", "b"], max_buckets=16))
    text = rtt.resolution(got.cdf)
    assert "merged to a coarser schema" in text
    assert rtt.resolution(pd.DataFrame(columns=rtt.CDF_COLUMNS)) == "no CDF sent"


def test_a_host_reference_is_never_a_path_whatever_list_it_came_in() -> None:
    doc = fleet_doc(["a", "b"])
    doc["paths"].append({**doc["host_references"][0]})  # a reference among the paths
    got = rtt.rtt_frames(doc)
    assert not (got.paths["src"] == got.paths["dst"]).any()
    assert len(got.references) == 3


def test_hostile_rows_and_cdfs_cost_only_themselves() -> None:
    good = {"src": "a", "dst": "b", "transport": "tcp", "op": "pingpong", "size": 64,
            "count": 10, "lost": 0, "min_s": 1e-5, "p99_s": 2e-5, "max_s": 3e-5,
            "schema": 6, "buckets": [-1000, -999], "counts": [4, 6]}  # fmt: skip
    bad_cdfs = [
        {"buckets": [-999, -1000], "counts": [4, 6]},  # not ascending
        {"buckets": [-999], "counts": [4, 6]},  # lengths differ
        {"schema": 9},
        {"schema": True},
        {"schema": None},
        {"counts": [-4, 6]},
        {"buckets": [1 << 30, (1 << 30) + 1]},
        {"buckets": "12"},
        {"counts": [0, 0]},  # an empty CDF
    ]
    rows: list[Any] = [good, "junk", None, {"count": "NaN", "p99_s": "inf", "src": 5}]
    rows += [{**good, "dst": f"b{i}", **bad} for i, bad in enumerate(bad_cdfs)]
    got = rtt.rtt_frames({"paths": rows, "host_references": "junk", "paths_total": "x"})
    assert got.dropped == 2 + len(bad_cdfs)
    assert len(got.paths) == 2 + len(bad_cdfs)  # their figures stay, their CDFs do not
    assert set(got.cdf["dst"]) == {"b"} and got.paths_total == 0
    assert math.isnan(got.paths.loc[got.paths["src"] == "5", "p99_s"].iloc[0])
    for junk in (None, {}, {"paths": 5}):
        assert rtt.rtt_frames(junk).paths.empty


def test_tor_table_and_classes() -> None:
    paths = pd.DataFrame(
        {
            "src": ["a", "b", "a"],
            "dst": ["b", "a", "c"],
            "transport": ["tcp"] * 3,
            "op": ["pingpong"] * 3,
            "size": ["64"] * 3,
            "p50_s": [1.0, 3.0, 5.0],
            "p99_s": [2.0, 9.0, 6.0],
            "exchanges": [90.0, 100.0, 0.0],
            "lost": [10.0, 0.0, 5.0],
        }
    )
    topo = pd.DataFrame({"src": ["a", "b", "c"], "topology": ["t1", "t1", ""]})
    tor = rtt.tor_table(frames.with_tor(paths, topo)).set_index(["src_tor", "dst_tor"])
    assert tor.loc[("t1", "t1"), "p50_s"] == 2.0  # the median of the pairs' p50
    assert tor.loc[("t1", "t1"), "p99_s"] == 9.0  # the worst pair's p99
    assert tor.loc[("t1", "t1"), "loss"] == pytest.approx(10 / 200)
    assert tor.loc[("t1", "(none)"), "loss"] == 1.0 and tor.loc[("t1", "t1"), "pairs"] == 2
    assert rtt.classes(paths) == [("tcp", "pingpong", "64")]
    assert rtt.classes(paths.iloc[0:0]) == [] and rtt.tor_table(paths.iloc[0:0]).empty
