"""A small client of the fabric's price for schedulers: what moving a request's KV cache
from a prefill host to a decode host costs on the fabric now.

    with PriceClient("collector:4794", ca_file="ca.pem", token_file="reader.token") as pc:
        cost = pc.cost("gpu-node-2", "gpu-node-3", 524_288)
        if cost.known:
            ...  # cost.p50_s, cost.p99_s (seconds), cost.age_s

It asks the collector's Query service (KvCost; the reader role). The answer is a price
or "unknown" with the reason; a collector that cannot be reached in `timeout_s` is an
unknown price too (`reachable` False), so a scheduler that routes on it goes on routing
by its own rule. Arguments that are wrong (an empty host, bytes out of range) raise
ValueError before anything is sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import grpc  # type: ignore[import-untyped]  # grpcio ships no type hints

from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.api import fabricprobe_pb2_grpc as pb_grpc
from fabricprobe.core.hostport import COLLECTOR_PORT
from fabricprobe.core.price import Price

DEFAULT_PORT = COLLECTOR_PORT
MAX_BYTES = 1 << 40  # as the collector bounds it (collector/price.py)
MAX_HOST = 253


@dataclass(frozen=True)
class KvCost(Price):
    """The collector's price of one transfer, or why there is none."""

    reachable: bool = True  # False: the collector did not answer (reason says why)


def check_request(src: str, dst: str, nbytes: int) -> None:
    """ValueError unless SRC, DST and NBYTES make a request the collector can answer."""
    for what, host in (("src", src), ("dst", dst)):
        if not host or len(host) > MAX_HOST:
            raise ValueError(f"{what} must be a host name of 1..{MAX_HOST} characters")
    if src == dst:
        raise ValueError("src and dst are the same host")
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or not 1 <= nbytes <= MAX_BYTES:
        raise ValueError(f"bytes must be a whole number 1..{MAX_BYTES}")


class PriceClient:
    """One channel to a collector's Query service, asked for prices (thread-safe, as
    gRPC channels are). Plain text only with insecure=True; otherwise TLS with CA_FILE,
    and a reader identity by token (TOKEN_FILE) or client certificate."""

    def __init__(
        self,
        collector: str,
        *,
        insecure: bool = False,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
        token_file: str | None = None,
        server_name: str | None = None,
        timeout_s: float = 0.5,
    ) -> None:
        if insecure == bool(ca_file):
            raise ValueError("give ca_file for TLS, or insecure=True for plain text (not both)")
        if bool(cert_file) != bool(key_file):
            raise ValueError("cert_file and key_file go together")
        if not 0 < timeout_s <= 60:
            raise ValueError("timeout_s must be in (0, 60]")
        target = collector if ":" in collector.rsplit("]", 1)[-1] else f"{collector}:{DEFAULT_PORT}"
        opts = [("grpc.ssl_target_name_override", server_name)] if server_name else []
        if insecure:
            self._channel = grpc.insecure_channel(target, options=opts)
        else:
            assert ca_file is not None
            creds = grpc.ssl_channel_credentials(
                root_certificates=Path(ca_file).read_bytes(),
                private_key=Path(key_file).read_bytes() if key_file else None,
                certificate_chain=Path(cert_file).read_bytes() if cert_file else None,
            )
            self._channel = grpc.secure_channel(target, creds, options=opts)
        token = Path(token_file).read_text().strip() if token_file else ""
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._stub = pb_grpc.QueryStub(self._channel)
        self.timeout_s = timeout_s

    def cost(self, src: str, dst: str, nbytes: int) -> KvCost:
        """The price of NBYTES from SRC to DST, or unknown with the reason."""
        check_request(src, dst, nbytes)
        try:
            reply = self._stub.KvCost(
                pb.KvCostRequest(src=src, dst=dst, bytes=nbytes),
                timeout=self.timeout_s,
                metadata=self._metadata,
            )
        except grpc.RpcError as e:
            reason = f"collector: {e.code().name}: {str(e.details())[:200]}"
            return KvCost(src, dst, nbytes, known=False, reason=reason, reachable=False)
        return KvCost.from_reply(reply)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> PriceClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
