"""Measurement primitives: device discovery, counters, RDMA and TCP probes, RoCEv2 checks.

The floor above fabricprobe.core (deadlines, host:port, errors, sketches) and below the
agent and the collector, of which it knows nothing; readers return plain frozen
dataclasses and never touch prometheus_client. Only probes/rdma/ imports probes/rdma/:
the TCP probe runs where libibverbs is not installed.
"""
