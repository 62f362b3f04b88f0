"""The bounds of a Prometheus native-histogram bucket, from the exposition format's
definition (bucket INDEX at SCHEMA covers (2^((INDEX-1)/2^SCHEMA), 2^(INDEX/2^SCHEMA)]):
the tests' oracle for fabricprobe.core.nativehist.bucket_index."""

from __future__ import annotations

from fabricprobe.core.nativehist import SCHEMA


def bucket_bounds(index: int, schema: int = SCHEMA) -> tuple[float, float]:
    """(lower, upper] of native bucket INDEX at SCHEMA, in seconds."""
    step = 2.0 ** (-schema)
    return 2.0 ** ((index - 1) * step), 2.0 ** (index * step)
