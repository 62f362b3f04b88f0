"""Only what pyproject.toml cannot say: the native probe loop, compiled by cffi at build time.

`pip install` of the sdist or the wheel builds `fabricprobe.probes.rdma.native._fastpath`
from fastpath.c against libibverbs (Debian/Ubuntu: libibverbs-dev; RHEL: rdma-core-devel).
FABRICPROBE_NATIVE=0 builds without it; `probe lat` then says that the pyverbs engine ran
and why.
"""

import os

from setuptools import setup

native = os.environ.get("FABRICPROBE_NATIVE", "1") != "0"
setup(cffi_modules=["fabricprobe/probes/rdma/native/build.py:builder"] if native else [])
