"""The ground floor, below the probes, the agent and the collector: deadlines
(deadline.py), host:port text (hostport.py), the error types and refusal reasons
(errors.py), the latency sketches (stats.py) and their wire codec (sketchwire.py), the
sketches kept for export (cumulative.py), the model shapes that fix a request's KV bytes
(models.py, which the workload and the collector both use), the agent API (proto and its
generated code), the fabric's price of a KV transfer as that API carries it (price.py,
which the collector answers and its clients read), the settings declarations both
daemons' configs are built from (settings.py, with tomlpos.py for reading TOML from
outside and the lines of its keys), the HTTP server every HTTP surface runs on (web.py)
and logging. It imports nothing else of the package: only the standard library and
third-party libraries."""
