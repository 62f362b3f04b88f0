"""The contract floor, below both the agent and the collector: the agent API (proto and its
generated code), the sketch codec, configuration errors and logging. It imports only
`fabricprobe.probes` (the sketch it encodes) and the standard library."""
