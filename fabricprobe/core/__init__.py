"""The contract floor, below both the agent and the collector: the agent API (proto and its
generated code), the sketch codec, configuration errors, the settings declarations both
daemons' configs are built from (settings.py, with tomlpos.py for the lines of a TOML
file) and logging. It imports only `fabricprobe.probes` (the sketch it encodes, the
address parser) and the standard library."""
