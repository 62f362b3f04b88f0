"""`probe report`: one self-contained HTML page and its PNGs, from a running collector
(its /metrics and Why query) and, when given, a Prometheus HTTP API.

sources.py reads them (I/O, deadlines, credentials), frames.py turns what they said
into frames (pure pandas), figures.py draws them (matplotlib, Agg), page.py assembles
the escaped HTML, build.py runs the steps in order.
"""
