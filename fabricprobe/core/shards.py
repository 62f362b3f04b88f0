"""Collector shards in etcd: the member records, who owns a host, and reading them.

Each collector shard keeps one key under `<prefix>shards/<name>` bound to a short etcd
lease it keeps alive; the value (JSON) names its agent API, OTLP and /metrics addresses.
A shard that dies stops refreshing its lease, and etcd deletes the key when the lease's
TTL runs out. Hosts' registrations live under `<prefix>hosts/<host>` (a serialized
HostInfo), so that every shard plans over the whole fleet.

A host's owner is chosen by rendezvous hashing of the host name over the live members'
names: every agent and every shard that reads the same member set computes the same
owner without asking anyone, and a member leaving moves only its own hosts.

etcd is reached through its JSON gateway (etcd3gw, the OpenStack client), which needs
no generated code matching our protobuf runtime.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_PREFIX = "/fabricprobe/"
MAX_MEMBERS = 256  # member records read; more are counted as dropped
MAX_RECORD = 1024  # bytes of one member record
MAX_NAME = 128
MAX_ENDPOINTS = 8
PAGE = 500  # keys per range request
MAX_WATCH_LINE = 64 << 20  # bytes of one watch answer (many host registrations at once)


class EtcdError(Exception):
    """etcd could not be read or written; the message says which endpoint and why."""


@dataclass(frozen=True, order=True)
class Member:
    """One live collector shard, as its etcd record names it."""

    name: str
    api: str  # agent API, HOST:PORT
    otlp: str = ""  # OTLP over gRPC, HOST:PORT (the API port when empty)
    metrics: str = ""  # /metrics, HOST:PORT

    def record(self) -> bytes:
        return json.dumps(
            {"name": self.name, "api": self.api, "otlp": self.otlp, "metrics": self.metrics},
            sort_keys=True,
        ).encode()

    @property
    def otlp_target(self) -> str:
        return self.otlp or self.api


def _hostport_ok(text: object) -> bool:
    if not isinstance(text, str) or not 0 < len(text) <= 261:
        return False
    host, sep, port = text.rpartition(":")
    return bool(sep and host and port.isdigit() and 0 < int(port) < 65536)


def parse_member(data: bytes) -> Member:
    """A member record; ValueError says what is wrong with it."""
    if len(data) > MAX_RECORD:
        raise ValueError(f"record of {len(data)} bytes (at most {MAX_RECORD})")
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"not JSON: {e}") from None
    except RecursionError:  # 1,024 bytes nest deeper than the decoder recurses
        raise ValueError("not JSON: nested too deep") from None
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    name = doc.get("name")
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME or any(c.isspace() for c in name):
        raise ValueError(f"bad shard name {str(name)[:40]!r}")
    api = doc.get("api")
    if not _hostport_ok(api):
        raise ValueError(f"shard {name}: bad api address {str(api)[:40]!r}")
    otlp, metrics = doc.get("otlp", ""), doc.get("metrics", "")
    for what, v in (("otlp", otlp), ("metrics", metrics)):
        if v != "" and not _hostport_ok(v):
            raise ValueError(f"shard {name}: bad {what} address {str(v)[:40]!r}")
    return Member(name, str(api), str(otlp), str(metrics))


def _score(member: str, host: str) -> int:
    digest = hashlib.blake2b(f"{member}\0{host}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def owner_of(host: str, members: Iterable[Member]) -> Member | None:
    """The member that owns HOST (rendezvous hashing), or None when there is none."""
    best: Member | None = None
    best_score = -1
    for m in members:
        s = _score(m.name, host)
        if s > best_score or (s == best_score and best is not None and m.name > best.name):
            best, best_score = m, s
    return best


def parse_endpoints(text: str) -> tuple[tuple[str, int], ...]:
    """`host:port[,host:port...]` -> ((host, port), ...); ValueError when malformed."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        host, sep, port = part.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{part!r}: expected HOST:PORT")
        out.append((host.strip("[]"), int(port)))
    if not out or len(out) > MAX_ENDPOINTS:
        raise ValueError(f"1 to {MAX_ENDPOINTS} etcd endpoints, got {len(out)}")
    return tuple(out)


class Etcd:
    """A small client over etcd's endpoints: each call tries them in turn, and the one
    that answered is tried first next time. Errors come out as EtcdError."""

    def __init__(
        self,
        endpoints: Sequence[tuple[str, int]],
        *,
        prefix: str = DEFAULT_PREFIX,
        timeout: float = 2.0,
        ca_file: str = "",
        cert_file: str = "",
        key_file: str = "",
    ) -> None:
        import etcd3gw  # here: only etcd users pay for importing requests

        self.prefix = prefix
        self.timeout = timeout
        protocol = "https" if ca_file else "http"
        self._clients = [
            etcd3gw.Etcd3Client(
                host=h,
                port=p,
                protocol=protocol,
                timeout=timeout,
                api_path="/v3/",  # etcd >= 3.4; no discovery round trip
                ca_cert=ca_file or None,
                cert_cert=cert_file or None,
                cert_key=key_file or None,
            )
            for h, p in endpoints
        ]
        for c in self._clients:
            # etcd is reached directly and trusts only CA_FILE: a requests session that
            # trusts the environment lets REQUESTS_CA_BUNDLE (set on many hosts) stand in
            # for the CA given, and HTTP(S)_PROXY route the fleet's membership elsewhere
            c.session.trust_env = False
        self.errors = 0
        self._lock = threading.Lock()  # one client serves several threads

    def call(self, what: str, fn: Any) -> Any:
        """FN(client) on the first endpoint that answers."""
        import etcd3gw.exceptions as ex
        import requests

        last = ""
        with self._lock:
            clients = list(self._clients)
        for client in clients:
            try:
                result = fn(client)
            except (ex.Etcd3Exception, requests.RequestException, KeyError, ValueError) as e:
                # etcd3gw's exceptions keep their text in detail_text, not in args
                text = str(e) or str(getattr(e, "detail_text", "") or "")
                last = f"{client.host}:{client.port}: {type(e).__name__}: {text[:200]}"
                continue
            if client is not clients[0]:
                with self._lock:  # the one that answered goes first next time
                    self._clients.remove(client)
                    self._clients.insert(0, client)
            return result
        with self._lock:
            self.errors += 1
        raise EtcdError(f"etcd {what}: {last}")

    def revision(self) -> int:
        """The store's revision: it changes with every write, never with a keepalive."""

        def fn(c: Any) -> int:
            body = {"key": b64(self.prefix), "range_end": b64(prefix_end(self.prefix))}
            doc = c.post(c.get_url("/kv/range"), json={**body, "count_only": True})
            return int(doc["header"]["revision"])

        return int(self.call("revision", fn))

    def read_prefix(
        self, sub: str, limit: int, *, serializable: bool = False
    ) -> list[tuple[bytes, bytes, int]]:
        """(key, value, lease) under PREFIX+SUB, at most LIMIT of them, in key order, read
        PAGE keys at a time (the gateway caps one answer's size). SERIALIZABLE: answered by
        the etcd member asked, without a quorum round (it may lag the leader by a
        heartbeat): what a fleet of readers should use."""
        start, end = (self.prefix + sub).encode(), prefix_end(self.prefix + sub)
        out: list[tuple[bytes, bytes, int]] = []
        while len(out) < limit:
            page = min(PAGE, limit - len(out))

            def fn(c: Any, start: bytes = start, page: int = page) -> dict[str, Any]:
                body: dict[str, Any] = {"key": b64(start), "range_end": b64(end), "limit": page}
                if serializable:
                    body["serializable"] = True
                return dict(c.post(c.get_url("/kv/range"), json=body))

            doc = self.call(f"read {self.prefix + sub}", fn)
            kvs = doc.get("kvs", [])
            out.extend(
                (unb64(kv["key"]), unb64(kv.get("value", "")), int(kv.get("lease", 0)))
                for kv in kvs
            )
            if not doc.get("more") or not kvs:
                break
            start = out[-1][0] + b"\0"  # the next key after the last one read
        return out

    def watch(self, start_revision: int, opened: list[Any]) -> Iterator[list[Change]]:
        """Batches of the changes under the prefix from START_REVISION on, as etcd's
        watch stream (through the gateway) delivers them (an empty one first, once the
        watch is in place), until it ends: then EtcdError
        (a broken stream, a compacted revision, etcd gone). The open response is put in
        OPENED, so that another thread can close it to stop the watch."""
        import requests

        body: dict[str, Any] = {
            "create_request": {
                "key": b64(self.prefix),
                "range_end": b64(prefix_end(self.prefix)),
                "start_revision": start_revision,
            }
        }
        last = ""
        with self._lock:
            clients = list(self._clients)
        for c in clients:
            try:  # no read timeout: a quiet fleet sends nothing for as long as it is quiet
                resp = c.session.post(
                    c.get_url("/watch"), json=body, stream=True, timeout=(self.timeout, None)
                )
                resp.raise_for_status()
            except requests.RequestException as e:
                last = f"{c.host}:{c.port}: {type(e).__name__}: {str(e)[:200]}"
                continue
            opened.append(resp)
            try:
                for line in _lines(resp.iter_content(chunk_size=None)):
                    doc = json.loads(line)
                    res = doc.get("result") if isinstance(doc, dict) else None
                    if not isinstance(res, dict):
                        raise EtcdError(f"etcd watch: {str(doc)[:200]}")
                    if int(res.get("compact_revision", 0) or 0) > 0 or res.get("canceled"):
                        raise EtcdError(f"etcd watch cancelled: {str(res)[:200]}")
                    got = [_change(ev) for ev in res.get("events", ())]
                    if got or res.get("created"):
                        yield got  # [] first: the watch is in place
            except (requests.RequestException, ValueError, KeyError, TypeError) as e:
                raise EtcdError(f"etcd watch: {type(e).__name__}: {str(e)[:200]}") from None
            finally:
                resp.close()
            raise EtcdError("etcd watch: the stream ended")
        with self._lock:
            self.errors += 1
        raise EtcdError(f"etcd watch: {last}")

    def members(self, *, serializable: bool = False) -> tuple[list[Member], int]:
        """(live members sorted by name, records that could not be read)."""
        rows = self.read_prefix("shards/", MAX_MEMBERS + 1, serializable=serializable)
        bad = max(0, len(rows) - MAX_MEMBERS)
        out = []
        for _, value, _ in rows[:MAX_MEMBERS]:
            try:
                out.append(parse_member(value))
            except ValueError:
                bad += 1
        return sorted(out), bad


@dataclass(frozen=True)
class Change:
    """One key changed under the prefix, as a watch delivers it."""

    deleted: bool
    key: bytes
    value: bytes
    lease: int
    revision: int


def _lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The newline-ended answers of a watch stream, whatever its chunks cut them into."""
    held = b""
    for chunk in chunks:
        held += chunk
        *done, held = held.split(b"\n")
        yield from (line for line in done if line.strip())
        if len(held) > MAX_WATCH_LINE:
            raise EtcdError(f"etcd watch: an answer of over {MAX_WATCH_LINE} bytes")


def _change(ev: dict[str, Any]) -> Change:
    kv = ev["kv"]
    return Change(
        ev.get("type") == "DELETE",
        unb64(kv["key"]),
        unb64(kv.get("value", "")),
        int(kv.get("lease", 0)),
        int(kv.get("mod_revision", 0)),
    )


def b64(text: str | bytes) -> str:
    raw = text.encode() if isinstance(text, str) else text
    return base64.b64encode(raw).decode()


def unb64(text: str) -> bytes:
    return base64.b64decode(text)


def prefix_end(prefix: str) -> bytes:
    """The range end that covers every key starting with PREFIX."""
    raw = bytearray(prefix.encode())
    raw[-1] += 1  # prefixes here end in "/", never in 0xff
    return bytes(raw)
