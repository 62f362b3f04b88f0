"""fabricprobe: RDMA fabric telemetry for LLM inference clusters."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("fabricprobe")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0+unknown"
