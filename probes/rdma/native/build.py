"""Build the native engine: fastpath.c as the cffi extension
`fabricprobe.probes.rdma.native._fastpath`.

The package build compiles it (setup.py hands `builder` to cffi's setuptools integration),
so a wheel or an sdist install has it; `main()` rebuilds it in place after fastpath.c
changes (scripts/build-native.sh, which installs what the build needs first).

API mode: compiled against libibverbs' headers and linked with -libverbs, in a scratch
directory so that only the finished `_fastpath*.so` lands beside this file.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MODULE = "fabricprobe.probes.rdma.native._fastpath"

# What Python sees of fastpath.c; the endpoint itself stays opaque.
CDEF = """
struct fp_info {
    uint32_t qpn, psn, rkey, gid_index, active_mtu, inline_size;
    uint64_t addr;
    uint8_t gid[16];
};
typedef struct fp_ep fp_ep;

fp_ep *fp_new(void);
void fp_free(fp_ep *ep);
void fp_close(fp_ep *ep);
void fp_stop(fp_ep *ep);
int fp_set_spin(fp_ep *ep, int64_t spin_ns);
const char *fp_error(const fp_ep *ep);
int fp_errno(const fp_ep *ep);
int fp_wc_status(const fp_ep *ep);

int fp_open(fp_ep *ep, const char *device, uint32_t size, uint32_t depth, uint32_t port,
            int gid_index, int remote_access, uint32_t inline_want, uint32_t psn);
int fp_info(const fp_ep *ep, struct fp_info *out);
int fp_connect(fp_ep *ep, uint32_t qpn, uint32_t psn, const uint8_t *gid, uint32_t mtu);

int64_t fp_send_pingpong(fp_ep *ep, uint32_t size, int64_t total, int first,
                         int64_t step_ns, int64_t *rtt_ns, int64_t *prober_ns);
int64_t fp_write_pingpong(fp_ep *ep, uint64_t raddr, uint32_t rkey, uint32_t size,
                          int64_t total, int first, int64_t step_ns, int64_t *rtt_ns,
                          int64_t *prober_ns);
int64_t fp_read_probe(fp_ep *ep, uint64_t raddr, uint32_t rkey, uint32_t size, int64_t total,
                      int64_t step_ns, int64_t *rtt_ns, int64_t *prober_ns);
int64_t fp_bandwidth(fp_ep *ep, int write, uint64_t raddr, uint32_t rkey, uint32_t size,
                     int64_t iters, uint32_t outstanding, int64_t step_ns,
                     int64_t *elapsed_ns);
int64_t fp_receive(fp_ep *ep, int64_t iters, int64_t step_ns, int64_t *elapsed_ns);
int fp_ud_open(fp_ep *ep, const char *device, uint32_t depth, uint32_t port, int gid_index,
               uint32_t qkey, uint32_t psn);
int fp_ud_hw_ts(const fp_ep *ep);
int fp_ud_remote(fp_ep *ep, uint32_t qpn, const uint8_t *gid);
int64_t fp_ud_probe(fp_ep *ep, int64_t count, int64_t step_ns, int64_t interval_ns,
                    int64_t late_ns, uint32_t seq0, int64_t *net, int64_t *raw, int64_t *delay,
                    int64_t *prober);
int64_t fp_ud_answer(fp_ep *ep, int64_t count, int64_t step_ns, int64_t idle_ns);
"""


def _shared() -> Any:
    """probes/native_loop/build.py, loaded by its path: cffi's setuptools integration and
    scripts/build-native.sh run this file on its own, before the package is importable."""
    path = HERE.parent.parent / "native_loop" / "build.py"
    spec = importlib.util.spec_from_file_location("fabricprobe_native_loop_build", path)
    assert spec is not None and spec.loader is not None, path
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def builder() -> Any:
    """The cffi FFI builder for the extension (cffi has no type hints: Any)."""
    return _shared().ffi_builder(MODULE, HERE / "fastpath.c", CDEF, ["ibverbs"])


def build(dest: Path = HERE) -> Path:
    """Compile in a scratch directory and copy the extension into DEST; returns its path."""
    return Path(_shared().build_into(builder(), MODULE, dest))


def main() -> int:
    print(f"build-native: {build()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
