"""The attribution: a stage span's way from OTLP to the join with the fabric and its analysis."""
