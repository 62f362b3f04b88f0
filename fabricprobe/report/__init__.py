"""`probe report`: one self-contained HTML page (and its PNGs) from a running collector
(its Query API: the Rtt and Why queries; its /metrics for the hosts) and, when given, a
Prometheus HTTP API for RTT over time.

sources.py reads them (I/O, deadlines, credentials), frames.py and rtt.py turn what they
said into frames (pure pandas), figures.py draws them (matplotlib, Agg), paths.py and
build.py make the page's sections, page.py assembles the escaped HTML, build.py runs the
steps in order.
"""
