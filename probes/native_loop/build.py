"""Build the TCP baseline's compiled loops: socketloop.c as the cffi extension
`fabricprobe.probes.native_loop._socketloop`.

The package build compiles it (setup.py hands `builder` to cffi's setuptools integration);
`main()` rebuilds it in place after socketloop.c changes (scripts/build-native.sh). It
needs a C compiler and libc only: no libibverbs, so the TCP probe's loop runs on any host.
"""

from __future__ import annotations

import importlib
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MODULE = "fabricprobe.probes.native_loop._socketloop"

CDEF = """
int64_t fp_clock_overhead_ns(int rounds);
int64_t fp_tcp_echo(int fd, uint8_t *buf, uint32_t size);
int64_t fp_tcp_pingpong(int fd, uint8_t *sbuf, uint8_t *rbuf, uint32_t size, int64_t total,
                        int64_t step_ns, int verify, uint32_t seq0, int64_t *rtt_ns,
                        int *status);
"""


def ffi_builder(module: str, source: Path, cdef: str, libraries: list[str] | None = None) -> Any:
    """A cffi FFI builder for MODULE compiled from SOURCE, of which Python sees CDEF (cffi
    has no type hints: Any). The RDMA engine's build.py builds its extension with it too."""
    cffi = importlib.import_module("cffi")
    ffi = cffi.FFI()
    ffi.cdef(cdef)
    ffi.set_source(
        module,
        source.read_text(),
        libraries=libraries or [],
        extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wno-unused-parameter"],
    )
    return ffi


def build_into(ffi: Any, module: str, dest: Path) -> Path:
    """Compile FFI (the builder of MODULE) in a scratch directory and copy the extension
    into DEST, replacing the one built before (the package build names it *.abi3.so);
    returns its path."""
    stem = module.rpartition(".")[2]
    with tempfile.TemporaryDirectory(prefix=f"{stem}-build.") as tmp:
        built = Path(ffi.compile(tmpdir=tmp))
        target = dest / built.name
        for stale in dest.glob(f"{stem}*.so"):
            stale.unlink()
        shutil.copy2(built, target)
    return target


def builder() -> Any:
    """The socket loop's builder (setup.py hands it to cffi's setuptools integration)."""
    return ffi_builder(MODULE, HERE / "socketloop.c", CDEF)


def build(dest: Path = HERE) -> Path:
    """Compile the socket loop into DEST; returns the extension's path."""
    return build_into(builder(), MODULE, dest)


def main() -> int:
    print(f"build-native: {build()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
