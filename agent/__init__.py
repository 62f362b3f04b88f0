"""The per-host agent: registers, probes its peers, samples counters, streams windows."""
