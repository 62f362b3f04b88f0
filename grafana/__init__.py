"""Grafana dashboards and Prometheus rules over fabricprobe's metrics (data files; see
build.py, which writes them)."""
