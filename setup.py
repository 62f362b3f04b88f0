"""Only what pyproject.toml cannot say: the native probe loops, compiled by cffi at build time.

`pip install` of the sdist or the wheel builds `fabricprobe.probes.native_loop._socketloop`
from socketloop.c (the TCP loops; libc only) and `fabricprobe.probes.rdma.native._fastpath`
from fastpath.c against libibverbs (Debian/Ubuntu: libibverbs-dev; RHEL: rdma-core-devel).
FABRICPROBE_NATIVE=0 builds neither; `probe lat` then says that the Python loop or the
pyverbs engine ran, and why.
"""

import os

from setuptools import setup

native = os.environ.get("FABRICPROBE_NATIVE", "1") != "0"
modules = [
    "fabricprobe/probes/native_loop/build.py:builder",
    "fabricprobe/probes/rdma/native/build.py:builder",
]
setup(cffi_modules=modules if native else [])
