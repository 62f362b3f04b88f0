"""Verbs-level RDMA probes through pyverbs. pyverbs is imported only here, and lazily by
callers, so everything else in fabricprobe runs on hosts without RDMA."""
