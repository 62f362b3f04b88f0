"""The collector: agent API, assignments, window store and Prometheus export."""
