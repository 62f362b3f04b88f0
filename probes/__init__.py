"""Measurement primitives: device discovery, counters, RDMA and TCP probes, RoCEv2 checks.

Nothing in this package knows about the agent or the collector; readers return plain
frozen dataclasses and never touch prometheus_client.
"""
